"""The batched decode step: every architecture's greedy tokens equal the unsplit model's ``generate``
(one prompt at a time) while sequences of different lengths join and leave the batch mid-run; the
stacked cache round-trips; padding never reaches the experts; one expert call per layer per step.

Tolerance (docs/serving.md): tokens must be equal, except at a near-tie: where the engine chose
another token than the reference, the reference's logits of the two must be within ``TIE_TOL``
(the batched forward moves logits by float rounding, ~4e-6 measured on these models); the
sequence is not compared past that point, since the two continuations legitimately differ.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from moeless.contracts.manifest import load_manifest
from moeless.experts.runtime import OnnxExpertPool
from moeless.model.reference import eos_token_ids
from moeless.model.split import load_split_model
from moeless.model.tiny import TINY_ARCHS, TinySpec, tiny_config
from moeless.serving.coalesce import StepCoalescer
from moeless.serving.decode_batch import DecodeBatch, row_of, stack_rows
from moeless.serving.generation import GenerationEngine, SamplingParams

TIE_TOL = 1e-4
# 1 to 171 tokens (tiny tokenizer): the 55-token prompt crosses GPT-OSS's 64-token sliding
# window while decoding, the 101- and 171-token ones in their prompts.
PROMPTS = [
    "The quick brown fox",
    "A",
    "Serverless functions scale to zero and back again, " * 2 + "and the bill",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 3,
    "Mixture of experts",
    "import numpy as np\nx =",
    "Serverless functions scale to zero and back again, " * 4,
]
MAX_TOKENS = [14, 9, 12, 6, 11, 3, 5]


def reference(model_dir: Path, prompts: list[str], max_tokens: list[int]) -> list[tuple[list[int], object]]:
    """Greedy ``generate`` of the unsplit fp32 checkpoint, one prompt at a time: (tokens, logits [n, V])."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = []
    for prompt, budget in zip(prompts, max_tokens, strict=True):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(
                ids, max_new_tokens=budget, do_sample=False, output_logits=True, return_dict_in_generate=True
            )
        results.append((out.sequences[0, ids.shape[1] :].tolist(), torch.stack(out.logits)[:, 0]))
    return results


def assert_greedy_equal(expected: tuple[list[int], object], got: list[int]) -> None:
    """``got`` (the engine's tokens, EOS appended if it stopped there) equals the reference up to a
    near-tie."""
    tokens, logits = expected
    for step, token in enumerate(tokens):
        assert step < len(got), f"the engine stopped after {len(got)} tokens, the reference made {tokens}"
        if got[step] != token:
            gap = float(logits[step, token] - logits[step, got[step]])
            assert gap <= TIE_TOL, f"token {step}: {got[step]} instead of {token}, logit gap {gap:.2e}"
            return
    assert len(got) == len(tokens), f"the engine went on past the reference: {got} vs {tokens}"


def engine_tokens(sequence, eos: int) -> list[int]:
    return sequence.generated + ([eos] if sequence.finish_reason == "stop" else [])


def run_staggered(engine: GenerationEngine, tokenizer, prompts: list[str], max_tokens: list[int]):
    """Half the prompts at once; the rest join mid-run: submitted from the engine's own loop as the
    first sequence streams its first text (or ends), so they join at the next step boundary
    whatever the machine's speed."""
    half = len(prompts) // 2
    joined = threading.Event()
    rest: list = []

    def submit(i: int, on_event=lambda e: None):
        return engine.submit(
            tokenizer(prompts[i])["input_ids"], SamplingParams(max_tokens[i], temperature=0.0), on_event
        )

    def join_the_rest(event) -> None:
        if not rest:  # the engine's loop thread calls this, one event at a time
            rest.extend(submit(i) for i in range(half, len(prompts)))
            joined.set()

    sequences = [submit(0, join_the_rest)] + [submit(i) for i in range(1, half)]
    assert joined.wait(120), "the first sequence never streamed"
    sequences += rest
    for sequence in sequences:
        assert sequence.done.wait(120), "generation did not finish"
        assert sequence.error is None, sequence.error
    return sequences


def assert_split_engine_equals_generate(tiny, arch: str, make_drafter=None, speculate: int = 0) -> dict:
    """Serve ``PROMPTS`` staggered through the split ``arch`` model's engine (with the drafter
    ``make_drafter(model_dir, tokenizer)`` makes, drafting ``speculate``), check every sequence
    against ``generate``; the engine's counters."""
    from transformers import AutoTokenizer

    model_dir, artifacts = tiny.model(arch), tiny.package(arch)
    expected = reference(model_dir, PROMPTS, MAX_TOKENS)
    coalescer = StepCoalescer(OnnxExpertPool(artifacts, load_manifest(artifacts)))
    model = load_split_model(artifacts, coalescer)
    tokenizer = AutoTokenizer.from_pretrained(artifacts / "backbone")
    drafter = make_drafter(model_dir, tokenizer) if make_drafter else None
    eos = eos_token_ids(model)
    engine = GenerationEngine(
        model, tokenizer, coalescer, eos, max_batch=8, drafter=drafter, speculate=speculate
    )
    try:
        sequences = run_staggered(engine, tokenizer, PROMPTS, MAX_TOKENS)
    finally:
        engine.stop()
    (eos_id,) = eos
    for reference_run, sequence in zip(expected, sequences, strict=True):
        assert_greedy_equal(reference_run, engine_tokens(sequence, eos_id))
    return engine.stats.snapshot()["counters"]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_split_model_batched_decode_equals_generate_with_joins_and_leaves(tiny, arch):
    assert_split_engine_equals_generate(tiny, arch)


def test_unsplit_engine_equals_generate_when_the_batch_is_smaller_than_the_requests(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # given max_batch 2: the others wait and join as rows leave, every step changes the batch
    model_dir = tiny.model("gpt_oss")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = GenerationEngine(model, tokenizer, None, eos_token_ids(model), max_batch=2)
    try:
        sequences = run_staggered(engine, tokenizer, PROMPTS, MAX_TOKENS)
    finally:
        engine.stop()
    (eos_id,) = eos_token_ids(model)
    for reference_run, sequence in zip(reference(model_dir, PROMPTS, MAX_TOKENS), sequences, strict=True):
        assert_greedy_equal(reference_run, engine_tokens(sequence, eos_id))


@pytest.mark.parametrize(("arch", "split"), [("gpt_oss", False), ("deepseek_v3", True)])
def test_chunked_prefill_equals_generate_and_no_forward_exceeds_the_chunk(tiny, arch, split):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # chunks of 7 prompt tokens per step across the new sequences: the long prompts take many
    # steps (GPT-OSS's 64-token sliding window is crossed inside the chunked prefill) while the
    # others decode, and a new sequence waits while the chunk is used up by those before it;
    # split, every chunk's expert calls go through the step's coalescer
    model_dir = tiny.model(arch)
    coalescer = None
    if split:
        artifacts = tiny.package(arch)
        coalescer = StepCoalescer(OnnxExpertPool(artifacts, load_manifest(artifacts)))
        model = load_split_model(artifacts, coalescer)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    widths: list[int] = []
    model.register_forward_pre_hook(
        lambda _module, _args, kwargs: widths.append(int(kwargs["input_ids"].shape[1])), with_kwargs=True
    )
    engine = GenerationEngine(model, tokenizer, coalescer, eos_token_ids(model), max_batch=4, prefill_chunk=7)
    try:
        sequences = run_staggered(engine, tokenizer, PROMPTS, MAX_TOKENS)
    finally:
        engine.stop()
    assert max(widths) <= 7
    longest = max(len(tokenizer(p)["input_ids"]) for p in PROMPTS)
    assert widths.count(7) >= longest // 7  # the longest prompt alone needs that many full chunks
    (eos_id,) = eos_token_ids(model)
    for reference_run, sequence in zip(reference(model_dir, PROMPTS, MAX_TOKENS), sequences, strict=True):
        assert_greedy_equal(reference_run, engine_tokens(sequence, eos_id))


def test_the_engine_refuses_an_empty_prompt_and_a_chunk_of_no_tokens(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tiny.model("mixtral")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="at least 1 token"):
        GenerationEngine(model, tokenizer, None, eos_token_ids(model), prefill_chunk=0)
    engine = GenerationEngine(model, tokenizer, None, eos_token_ids(model))
    try:
        with pytest.raises(ValueError, match="no tokens"):
            engine.submit([], SamplingParams(4), lambda event: None)
        assert engine.load() == (0, 0)
    finally:
        engine.stop()


class CountingExecutor:
    """The in-process experts, counting each call's rows per layer."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: dict[int, int] = {}
        self.rows: dict[int, int] = {}
        self.lock = threading.Lock()

    def run(self, layer: int, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        with self.lock:
            self.calls[layer] = self.calls.get(layer, 0) + 1
            self.rows[layer] = self.rows.get(layer, 0) + sum(len(rows) for rows in inputs.values())
        return self.inner.run(layer, inputs)


def test_one_expert_call_per_layer_per_step_and_no_padding_rows(tiny):
    from transformers import AutoTokenizer

    artifacts = tiny.package("mixtral")
    manifest = load_manifest(artifacts)
    counting = CountingExecutor(OnnxExpertPool(artifacts, manifest))
    coalescer = StepCoalescer(counting)
    model = load_split_model(artifacts, coalescer)
    tokenizer = AutoTokenizer.from_pretrained(artifacts / "backbone")
    engine = GenerationEngine(model, tokenizer, coalescer, eos_token_ids(model), max_batch=8)
    try:  # given: all prompts in one step (the loop waits on the queue's lock), so the step count is
        # the longest sequence's token count
        with engine._cond:
            sequences = [
                engine.submit(tokenizer(p)["input_ids"], SamplingParams(n, temperature=0.0), lambda e: None)
                for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)
            ]
        for sequence in sequences:
            assert sequence.done.wait(120) and sequence.error is None
    finally:
        engine.stop()
    # every forwarded token (the prompt, then each sampled token but the last) goes to top_k experts;
    # a padded cache position sent to an expert would add rows
    sampled = [len(s.generated) + (s.finish_reason == "stop") for s in sequences]
    forwarded = [len(s.prompt_ids) + n - 1 for s, n in zip(sequences, sampled, strict=True)]
    layers = sorted(counting.calls)
    assert layers and all(counting.calls[layer] == max(sampled) for layer in layers)
    assert all(counting.rows[layer] == sum(forwarded) * manifest.top_k for layer in layers)
    for sequence, tokens in zip(sequences, forwarded, strict=True):  # the router hook's per-sequence routing
        assert sorted(sequence.routing) == layers
        assert all(sum(sequence.routing[layer].values()) == tokens * manifest.top_k for layer in layers)


def test_stacked_rows_round_trip_with_a_sliding_window_layer():
    import torch
    from transformers import DynamicCache

    # given GPT-OSS's layer kinds (full and 4-token sliding window) and rows of 2, 7 and 5 tokens
    config = tiny_config(TinySpec(arch="gpt_oss", layers=2), eos_id=0, pad_id=1)
    config.sliding_window = 4
    kinds = [getattr(layer, "is_sliding", False) for layer in DynamicCache(config=config).layers]
    assert sorted(kinds) == [False, True]
    lengths = [2, 7, 5]
    generator = torch.Generator().manual_seed(0)
    rows = []
    for length in lengths:
        row = []
        for sliding in kinds:
            n = min(length, 3) if sliding else length  # the window keeps window - 1 columns
            row.append(tuple(torch.randn(2, n, 8, generator=generator) for _ in range(2)))
        rows.append(row)
    # when stacked
    cache, mask = stack_rows(config, rows, lengths)
    # then each row is right-aligned behind zeros, the mask marks its own tokens, the timeline is 7
    assert mask.tolist() == [[0, 0, 0, 0, 0, 1, 1], [1] * 7, [0, 0, 1, 1, 1, 1, 1]]
    assert cache.get_seq_length() == 7
    for index, sliding in enumerate(kinds):
        layer = cache.layers[index]
        assert layer.keys.shape == (3, 2, 3 if sliding else 7, 8)
        if sliding:
            assert layer.get_seq_length() == 7 and layer.get_mask_sizes(1) == (4, 4)
    for b, length in enumerate(lengths):
        for index, (keys, values) in enumerate(row_of(cache, b, length)):
            assert torch.equal(keys, rows[b][index][0]) and torch.equal(values, rows[b][index][1])
    assert torch.count_nonzero(cache.layers[kinds.index(False)].keys[0, :, :5]) == 0


def test_decode_batch_rebuild_keeps_order_and_drops_leavers():
    import torch
    from transformers import DynamicCache

    config = tiny_config(TinySpec(arch="mixtral", layers=1), eos_id=0, pad_id=1)

    def one_row(length: int, value: float):
        cache = DynamicCache(config=config)
        cache.layers[0].update(torch.full((1, 2, length, 4), value), torch.full((1, 2, length, 4), -value))
        return cache

    batch = DecodeBatch(config)
    batch.rebuild([], [("a", one_row(3, 1.0), 3), ("b", one_row(5, 2.0), 5)])
    inputs = batch.inputs([[10], [11]], "cpu")
    assert inputs["position_ids"].tolist() == [[3], [5]] and inputs["attention_mask"].shape == (2, 6)
    batch.cache.layers[0].update(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))  # what the forward adds
    batch.advanced(inputs)
    # when "b" (the longest) leaves and "c" joins, the timeline shrinks to the longest remaining row
    batch.rebuild(["a"], [("c", one_row(2, 3.0), 2)])
    assert batch.members == ["a", "c"] and batch.lengths == [4, 2]
    assert batch.mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    keys = batch.cache.layers[0].keys
    assert keys[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 0.0] and keys[1, 0, :, 0].tolist() == [0, 0, 3.0, 3.0]
    batch.rebuild([], [])
    assert batch.members == [] and batch.cache is None


def test_a_sequence_whose_sampling_breaks_fails_alone_and_the_engine_serves_on(tiny, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from moeless.serving import generation
    from moeless.serving.generation import SamplingParams

    # GIVEN sampling that raises for one request's seed (schemathesis once found such a request,
    # and the engine's thread died with it: every later request hung)
    real = generation.sample_token

    def sample(logits, params, generator):
        if params.seed == 13:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(logits, params, generator)

    monkeypatch.setattr(generation, "sample_token", sample)
    model_dir = tiny.model("mixtral")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = GenerationEngine(model, tokenizer, None, eos_token_ids(model), max_batch=4)
    try:
        ids = tokenizer("Serverless")["input_ids"]
        broken = engine.submit(ids, SamplingParams(4, temperature=1.0, seed=13), lambda e: None)
        fine = engine.submit(ids, SamplingParams(4, temperature=0.0), lambda e: None)
        # THEN the broken one fails with the reason, the other finishes beside it, and so do later ones
        assert broken.done.wait(60) and "RuntimeError" in (broken.error or "")
        assert fine.done.wait(60) and fine.error is None and fine.generated
        later = engine.submit(ids, SamplingParams(4, temperature=0.0), lambda e: None)
        assert later.done.wait(60) and later.error is None and later.generated == fine.generated
    finally:
        engine.stop()
