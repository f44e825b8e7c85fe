"""Train a small MoE on real text, on the CPU, so that its routing means something.

A random-init model routes tokens by noise; predictors and plans evaluated on it say nothing about
real workloads. This trains a tiny model (default: Mixtral, 4 layers x 8 experts, top-2) as
language model on real prose, with the architecture's load-balancing auxiliary loss
(``output_router_logits=True`` adds ``router_aux_loss_coef`` x the Switch-style balance loss).

Default text: the standard library's documentation (``pydoc_data``), which every Python carries,
so it works on a fresh clone; ``texts`` takes other files. Deterministic for a seed and a number
of steps (a ``minutes`` cap may stop it earlier, which the report says).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moeless.model.tiny import SPECIAL_TOKENS, TinySpec, python_doc_text, tiny_config, train_tokenizer

REPORT_NAME = "training_report.json"


@dataclass(frozen=True)
class TrainSpec:
    arch: str = "mixtral"
    layers: int = 4
    experts: int = 8
    top_k: int = 2
    hidden: int = 128
    intermediate: int = 256
    vocab: int = 2048
    seq_len: int = 128
    batch: int = 16
    steps: int = 600
    learning_rate: float = 3e-3
    aux_loss_coef: float = 0.02
    seed: int = 0
    minutes: float | None = None


@dataclass
class TrainReport:
    steps: int
    seconds: float
    train_loss: float
    heldout_perplexity: float
    heldout_tokens: int
    train_tokens: int
    text: str
    stopped_by_time: bool
    spec: dict


def train_model(
    out_dir: Path, spec: TrainSpec = TrainSpec(), texts: list[Path] | None = None, progress: bool = True
) -> TrainReport:
    """Train and save a checkpoint (config, weights, tokenizer, report) to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    text, source = _corpus(texts)
    tokenizer = train_tokenizer(spec.vocab, text)
    eos_id = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0])
    pad_id = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[1])
    tiny = TinySpec(
        spec.arch,
        spec.layers,
        spec.experts,
        spec.top_k,
        spec.hidden,
        spec.intermediate,
        spec.vocab,
        spec.seed,
    )
    config = tiny_config(tiny, eos_id, pad_id)
    config.router_aux_loss_coef = spec.aux_loss_coef
    train_ids, heldout_ids = _split(tokenizer, text, spec.seq_len)

    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fit = _fit(model, train_ids, spec, progress, output_router_logits=True)
    perplexity = heldout_perplexity(model, heldout_ids, spec.seq_len)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False
    )
    return _save(Path(out_dir), model, tokenizer, fit, perplexity, (train_ids, heldout_ids), source, spec)


@dataclass(frozen=True)
class _Fit:
    steps: int
    seconds: float
    loss: float
    stopped: bool


def _fit(model: Any, train_ids: Any, spec: TrainSpec | DraftSpec, progress: bool, **forward: Any) -> _Fit:
    """AdamW with warm-up and cosine decay over ``spec.steps`` batches of random windows."""
    import torch
    from tqdm import tqdm

    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    warmup = max(1, spec.steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, spec.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    started = time.perf_counter()
    model.train()
    bar = tqdm(range(spec.steps), desc="training", unit="step", disable=not progress)
    loss_value, steps_done, stopped = float("nan"), 0, False
    for step in bar:
        starts = torch.randint(0, len(train_ids) - spec.seq_len - 1, (spec.batch,), generator=generator)
        batch = torch.stack([train_ids[s : s + spec.seq_len] for s in starts.tolist()])
        out = model(input_ids=batch, labels=batch, **forward)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss_value, steps_done = float(out.loss.detach()), step + 1
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss_value:.3f}")
        if spec.minutes is not None and time.perf_counter() - started > spec.minutes * 60:
            stopped = True
            break
    bar.close()
    return _Fit(steps_done, round(time.perf_counter() - started, 1), loss_value, stopped)


@dataclass(frozen=True)
class DraftSpec:
    """A small dense model (Llama blocks) that drafts for a trained MoE: same tokenizer, same text."""

    layers: int = 2
    hidden: int = 128
    intermediate: int = 256  # 2 x hidden
    seq_len: int = 128
    batch: int = 16
    steps: int = 600
    learning_rate: float = 3e-3
    seed: int = 0
    minutes: float | None = None


def train_draft_model(
    out_dir: Path, target_dir: Path, spec: DraftSpec = DraftSpec(), texts: list[Path] | None = None,
    progress: bool = True,
) -> TrainReport:  # fmt: skip
    """Train a dense draft for the model in ``target_dir`` on the same text, with its tokenizer, so
    that ``serve --draft-model`` can verify its guesses token for token."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig

    text, source = _corpus(texts)
    tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    target = AutoConfig.from_pretrained(target_dir, local_files_only=True)
    config = LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=target.max_position_embeddings, bos_token_id=target.bos_token_id,
        eos_token_id=target.eos_token_id, pad_token_id=target.pad_token_id, tie_word_embeddings=True,
        initializer_range=min(0.1, spec.hidden**-0.5),
    )  # fmt: skip
    train_ids, heldout_ids = _split(tokenizer, text, spec.seq_len)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fit = _fit(model, train_ids, spec, progress)
    perplexity = heldout_perplexity(model, heldout_ids, spec.seq_len)
    model.generation_config = GenerationConfig(
        bos_token_id=target.bos_token_id, eos_token_id=target.eos_token_id,
        pad_token_id=target.pad_token_id, do_sample=False,
    )  # fmt: skip
    return _save(Path(out_dir), model, tokenizer, fit, perplexity, (train_ids, heldout_ids), source, spec)


def _corpus(texts: list[Path] | None) -> tuple[str, str]:
    """The training text (``texts`` joined, else Python's own documentation) and its source."""
    if texts:
        return "\n\n".join(p.read_text(errors="replace") for p in texts), ", ".join(str(p) for p in texts)
    return python_doc_text(), "pydoc_data (Python's own documentation)"


def _split(tokenizer: Any, text: str, seq_len: int) -> tuple[Any, Any]:
    """``text``'s token ids: the first 95% to train on, the rest held out (at least one window)."""
    import torch

    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    cut = int(len(ids) * 0.95)
    if len(ids) - cut <= seq_len + 1:
        raise ValueError(f"the text is too short to train on ({len(ids)} tokens)")
    return ids[:cut], ids[cut:]


def _save(
    out_dir: Path, model: Any, tokenizer: Any, fit: _Fit, perplexity: float, ids: tuple[Any, Any],
    source: str, spec: Any,
) -> TrainReport:  # fmt: skip
    """Write the checkpoint (config, weights, tokenizer) and its report to ``out_dir``."""
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    train_ids, heldout_ids = ids
    report = TrainReport(
        fit.steps, fit.seconds, fit.loss, perplexity, len(heldout_ids), len(train_ids), source, fit.stopped,
        asdict(spec),
    )  # fmt: skip
    (out_dir / REPORT_NAME).write_text(json.dumps(asdict(report), indent=2))
    return report


def heldout_perplexity(model, ids, seq_len: int) -> float:
    """exp(mean next-token cross-entropy) over consecutive held-out windows (no auxiliary loss)."""
    import torch

    model.eval()
    losses, tokens = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(ids) - seq_len - 1, seq_len):
            window = ids[start : start + seq_len].unsqueeze(0)
            loss = model(input_ids=window, labels=window).loss
            losses += float(loss) * (seq_len - 1)
            tokens += seq_len - 1
    return math.exp(losses / max(tokens, 1))


def trained_model(
    cache_dir: Path, spec: TrainSpec = TrainSpec(), texts: list[Path] | None = None, progress: bool = True
) -> Path:
    """The cached model trained for ``spec`` on ``texts``: trained once, reused by the demo and benchmarks."""
    corpus = "-".join(p.stem for p in texts) if texts else "pydoc"
    out = Path(cache_dir) / f"trained-{spec.arch}-{corpus}-s{spec.seed}-{spec.steps}"
    report = out / REPORT_NAME
    if report.is_file() and json.loads(report.read_text()).get("spec") == asdict(spec):
        return out
    train_model(out, spec, texts, progress=progress)
    return out


def trained_draft(
    target_dir: Path, spec: DraftSpec = DraftSpec(), texts: list[Path] | None = None, progress: bool = True
) -> Path:
    """The cached draft of the trained model in ``target_dir`` (beside it): trained once."""
    out = Path(target_dir).parent / f"{Path(target_dir).name}-draft-s{spec.seed}-{spec.steps}"
    report = out / REPORT_NAME
    if report.is_file() and json.loads(report.read_text()).get("spec") == asdict(spec):
        return out
    train_draft_model(out, target_dir, spec, texts, progress=progress)
    return out
