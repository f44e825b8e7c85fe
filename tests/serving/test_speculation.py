"""Speculative decoding: drafts verified in one forward give the tokens decoding one at a time gives.

Greedy: token-identical to ``generate`` (up to the near-tie rule of test_batched_decode.py) with
each drafter on two architectures, one with sliding-window layers; the cache after a rejection is
what one-at-a-time decoding caches; speculative sampling keeps the model's distribution.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from moeless.contracts.manifest import load_manifest
from moeless.experts.runtime import OnnxExpertPool
from moeless.model.reference import eos_token_ids
from moeless.model.split import load_split_model
from moeless.serving.coalesce import StepCoalescer
from moeless.serving.drafting import PromptLookupDrafter, lookup_continuation
from moeless.serving.generation import GenerationEngine
from moeless.serving.speculation import target_probs, verify
from tests.serving.test_batched_decode import (
    PROMPTS,
    assert_split_engine_equals_generate,
)


def test_prompt_lookup_continues_the_latest_earlier_occurrence_of_the_longest_tail():
    assert lookup_continuation([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2) == [7, 5]
    assert lookup_continuation([4, 5, 6, 8, 6], 3) == [8, 6]  # only the last token matches
    assert lookup_continuation([1, 2, 3], 4) == []
    assert lookup_continuation([1, 2, 1], 0) == []


def test_greedy_verification_keeps_drafts_up_to_the_first_disagreement_then_the_models_token():
    import torch

    logits = torch.full((4, 6), -1.0)
    for position, best in enumerate([3, 1, 4, 2]):
        logits[position, best] = 1.0
    assert verify(logits, [3, 1, 4], 0.0, 1.0) == [3, 1, 4, 2]
    assert verify(logits, [3, 5, 4], 0.0, 1.0) == [3, 1]
    assert verify(logits[:1], [], 0.0, 1.0) == [3]


@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss"])
def test_prompt_lookup_speculation_is_token_identical_to_generate(tiny, arch):
    counters = assert_split_engine_equals_generate(tiny, arch, lambda *_: PromptLookupDrafter(), speculate=4)
    assert (
        counters["draft_tokens_proposed"] > 0 and counters["decode_tokens"] > counters["decode_verifications"]
    )
    # every verification with room for a draft counts as room at position 1, whether or not lookup
    # found one (each sequence's last verification may have none); those that found one carried it
    verifications = counters["decode_verifications"]
    assert verifications - len(PROMPTS) <= counters["draft_room_1"] <= verifications
    assert counters["draft_tried_1"] == counters["draft_carried_1"] <= counters["draft_room_1"]


def test_a_rejected_draft_leaves_the_cache_one_at_a_time_decoding_leaves(tiny):
    """GIVEN two sequences decoding together on GPT-OSS, the long one (its sliding-window layers
    full) with its second draft wrong, the other with both right; WHEN verified in one
    forward and rolled back: each row's cache and the next step's logits are one-at-a-time's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from moeless.serving.decode_batch import DecodeBatch, row_of

    model_dir = tiny.model("gpt_oss")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(PROMPTS[3])["input_ids"], tokenizer(PROMPTS[0])["input_ids"]]
    assert len(prompts[0]) > model.config.sliding_window > len(prompts[1])

    def one_at_a_time(ids: list[int], steps: int):
        """Greedy tokens, the cache after feeding ``steps`` of them, and the logits after that."""
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
            tokens = [int(out.logits[0, -1].argmax())]
            for _ in range(steps):
                out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
                tokens.append(int(out.logits[0, -1].argmax()))
        return tokens, cache, out.logits[0, -1]

    batch = DecodeBatch(model.config)
    joining = []
    for name, ids in zip("ab", prompts, strict=True):
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        joining.append((name, cache, len(ids)))
    batch.rebuild([], joining)
    greedy = [one_at_a_time(ids, 3)[0] for ids in prompts]
    rows = [[greedy[0][0], greedy[0][1], greedy[0][2] + 1], greedy[1][:3]]  # a's second draft is wrong
    inputs = batch.inputs(rows, "cpu")
    with torch.inference_mode():
        out = model(**inputs, use_cache=True, logits_to_keep=3)
    accepted = [verify(out.logits[b], rows[b][1:], 0.0, 1.0) for b in range(2)]
    assert accepted == [greedy[0][1:3], greedy[1][1:4]]
    batch.advanced(inputs, [len(a) for a in accepted])
    for b, ids in enumerate(prompts):
        fed = len(accepted[b])  # the row's last token and its accepted drafts are cached
        _tokens, cache, _logits = one_at_a_time(ids, fed)
        assert batch.lengths[b] == len(ids) + fed
        for got, want in zip(row_of(batch.cache, b, batch.lengths[b]), cache.layers, strict=True):
            assert got is not None
            keys = want.keys[0]
            torch.testing.assert_close(got[0][:, -keys.shape[-2] :], keys, atol=1e-5, rtol=1e-4)
    # and the next plain step sees what one-at-a-time decoding sees
    nexts = [[a[-1]] for a in accepted]
    inputs = batch.inputs(nexts, "cpu")
    with torch.inference_mode():
        out = model(**inputs, use_cache=True)
    batch.advanced(inputs)
    for b, ids in enumerate(prompts):
        *_, logits = one_at_a_time(ids, len(accepted[b]) + 1)
        torch.testing.assert_close(out.logits[b, -1], logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("drafter", ["prompt lookup", "draft model"])
def test_speculative_sampling_keeps_the_models_distribution(tiny, drafter):
    """Over many seeded verifications of one drafted token on a tiny model, the first token generated
    is distributed as the model's own p (temperature 0.7, top-p 0.9), whether the draft was chosen
    deterministically (prompt lookup) or sampled from another model's q."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def logits_of(model_dir, ids):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.inference_mode():
            return model(torch.tensor([ids])).logits[0, -2:].double()

    target = tiny.model("mixtral")
    ids = AutoTokenizer.from_pretrained(target)("Serverless functions scale to")["input_ids"]
    logits = logits_of(target, ids)  # after the context, and after one more token
    p = target_probs(logits[0], 0.7, 0.9)
    q = (
        target_probs(logits_of(tiny.model("mixtral", seed=1), ids)[0], 0.7, 0.9)
        if drafter == "draft model"
        else None
    )
    fixed = int(torch.argsort(p, descending=True)[1])  # a likely token, not the likeliest
    samples = 20_000
    counts = np.zeros(len(p))
    for seed in range(samples):
        generator = torch.Generator().manual_seed(seed)
        draft = fixed if q is None else int(torch.multinomial(q, 1, generator=generator))
        first = verify(logits, [draft], 0.7, 0.9, generator, None if q is None else [q])[0]
        counts[first] += 1
    expected = p.numpy() * samples
    assert counts[expected == 0].sum() == 0, "a token outside the nucleus was generated"
    big = expected >= 5  # chi-square bins: the rare tokens pooled into one
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    keep = wanted > 0
    chi2 = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    dof = int(keep.sum()) - 1
    limit = dof + 4 * np.sqrt(2 * dof)  # far beyond chance: about p < 1e-4
    assert chi2 < limit, f"chi-square {chi2:.1f} on {dof} degrees of freedom (limit {limit:.1f})"


def test_seeded_sampling_with_speculation_is_reproducible(tiny):
    from transformers import AutoTokenizer

    from moeless.serving.generation import SamplingParams

    artifacts = tiny.package("mixtral")
    coalescer = StepCoalescer(OnnxExpertPool(artifacts, load_manifest(artifacts)))
    model = load_split_model(artifacts, coalescer)
    tokenizer = AutoTokenizer.from_pretrained(artifacts / "backbone")
    engine = GenerationEngine(
        model, tokenizer, coalescer, eos_token_ids(model), drafter=PromptLookupDrafter(), speculate=3
    )
    ids = tokenizer(PROMPTS[2])["input_ids"]
    try:
        runs = [
            engine.submit(ids, SamplingParams(12, temperature=0.9, seed=seed), lambda e: None)
            for seed in (7, 7, 8)
        ]
        for sequence in runs:
            assert sequence.done.wait(120) and sequence.error is None
    finally:
        engine.stop()
    assert runs[0].generated == runs[1].generated


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_a_draft_model_speculation_is_token_identical_and_a_perfect_draft_is_all_accepted(tiny, arch):
    """The unsplit checkpoint drafting for its split self agrees almost always (up to float
    rounding), so most drafts are kept; the tokens are generate's all the same."""
    from moeless.serving.drafting import ModelDrafter

    drafters = []

    def make_drafter(model_dir, tokenizer):  # every guess: a random model is unsure of them
        drafters.append(ModelDrafter(model_dir, "cpu", tokenizer.get_vocab(), min_confidence=0.0))
        return drafters[0]

    counters = assert_split_engine_equals_generate(tiny, arch, make_drafter, speculate=3)
    assert counters["draft_tokens_accepted"] >= 0.9 * counters["draft_tokens_proposed"] > 0
    assert counters["decode_tokens"] >= 2 * counters["decode_verifications"]
    assert not drafters[0].caches, "every finished sequence's draft cache is released"


def test_a_draft_model_with_another_tokenizer_is_refused(tiny):
    from transformers import AutoTokenizer

    from moeless.errors import DraftModelError
    from moeless.serving.drafting import ModelDrafter

    other = tiny.model("mixtral", vocab=400)
    target = AutoTokenizer.from_pretrained(tiny.model("mixtral"))
    with pytest.raises(DraftModelError, match="another tokenizer"):
        ModelDrafter(other, "cpu", target.get_vocab())


def test_a_trained_draft_shares_its_targets_tokenizer_and_drafts(tiny, tmp_path):
    from click.testing import CliRunner
    from transformers import AutoTokenizer

    from cli.main import cli
    from moeless.serving.drafting import DraftRequest, ModelDrafter

    target = tiny.model("mixtral")
    result = CliRunner().invoke(
        cli, ["model", "train-draft", str(tmp_path / "draft"), "--target", str(target), "--steps", "3", "-q"]
    )
    assert result.exit_code == 0, result.output
    vocab = AutoTokenizer.from_pretrained(target).get_vocab()
    drafter = ModelDrafter(tmp_path / "draft", "cpu", vocab, min_confidence=0.0)  # 3 steps: unsure
    (draft,) = drafter.propose([DraftRequest("s", [5, 6, 7])], 3)
    assert len(draft.tokens) == 3 and draft.probs is None
    (again,) = drafter.propose([DraftRequest("s", [5, 6, 7, draft.tokens[0]])], 3)  # its cache continues
    assert again.tokens[:2] == draft.tokens[1:]
    drafter.release("s")
    assert not drafter.caches


def test_a_draft_stops_before_its_first_unsure_token(tiny):
    """With ``min_confidence`` t the draft is the longest prefix of the unconstrained one whose every
    token the draft model gives at least t (checked against the model's own probabilities)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from moeless.serving.drafting import DraftRequest, ModelDrafter

    model_dir = tiny.model("mixtral")
    vocab = AutoTokenizer.from_pretrained(model_dir).get_vocab()
    context, k = [5, 6, 7, 8], 4
    (full,) = ModelDrafter(model_dir, "cpu", vocab, min_confidence=0.0).propose(
        [DraftRequest("s", context)], k
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([context + full.tokens[:-1]])).logits[0, len(context) - 1 :]
    confidence = [float(torch.softmax(row, -1)[t]) for row, t in zip(logits, full.tokens, strict=True)]
    levels = sorted(set(confidence))
    thresholds = [levels[0] / 2, *((a + b) / 2 for a, b in pairwise(levels)), 1.01]
    for threshold in thresholds:
        kept = 0
        while kept < k and confidence[kept] >= threshold:
            kept += 1
        drafter = ModelDrafter(model_dir, "cpu", vocab, min_confidence=threshold)
        (draft,) = drafter.propose([DraftRequest("s", context)], k)
        assert draft.tokens == full.tokens[:kept], threshold
        longer = [DraftRequest("s", [*context, full.tokens[0]])]
        fresh = ModelDrafter(model_dir, "cpu", vocab, min_confidence=threshold)
        assert drafter.propose(longer, k) == fresh.propose(longer, k), "the cut draft's cache continues"


def test_serve_refuses_a_draft_model_without_speculation(tiny):
    from click.testing import CliRunner

    from cli.main import cli

    artifacts, model_dir = tiny.package("mixtral"), tiny.model("mixtral")
    result = CliRunner().invoke(
        cli, ["serve", str(artifacts), "--draft-model", str(model_dir), "--speculate", "0"]
    )
    assert result.exit_code == 2 and "give K >= 1" in result.output
