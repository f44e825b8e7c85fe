"""What the unsplit model says: greedy ``generate`` on the original checkpoint, the yardstick every
answer of the split system (backbone + expert functions) is held to."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def greedy_texts(model_dir: Path, prompts: list[str], max_new_tokens: int) -> list[str]:
    """The unsplit fp32 checkpoint's greedy continuation of each prompt, decoded without special tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return texts


def eos_token_ids(model: Any) -> set[int]:
    """The ids that end generation, as ``generate`` reads them (generation config, else model config)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}
