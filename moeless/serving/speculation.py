"""Verifying drafted tokens: which of them the model itself would have produced.

One forward of the model over a sequence's last token and its ``k`` drafts gives the model's
logits at ``k + 1`` positions. :func:`verify` turns them into the tokens generated:

* **greedy** (temperature 0): the drafts up to the first the model's argmax disagrees with, then
  the argmax there; token for token what decoding one token per forward gives.
* **sampling**: speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via
  Speculative Decoding"; Chen et al. 2023): draft ``d`` drawn from the drafter's ``q`` is kept with
  probability ``min(1, p(d) / q(d))``; the first one refused is replaced by a draw from
  ``max(p - q, 0)`` normalised, and if all are kept one more token is drawn from ``p`` at the last
  position. The tokens are then distributed exactly as sampling ``p`` one token per forward, where
  ``p`` is what :func:`target_probs` gives (temperature and top-p applied). A deterministic drafter
  (prompt lookup) has a one-hot ``q``: ``d`` is kept with probability ``p(d)``.

Every token generated is therefore either accepted by the model or drawn from it: the drafter can
only change how many forwards a completion takes, never what it says.
"""

from __future__ import annotations

from typing import Any


def target_probs(logits: Any, temperature: float, top_p: float) -> Any:
    """The distribution one sampled token is drawn from (float64 ``[V]``): softmax of ``logits``
    at ``temperature`` (``> 0``), cut to the top-p nucleus (the most likely token always stays)."""
    import torch

    # shifted so the largest logit is 0: a tiny temperature sends the others to -inf, never the
    # softmax to nan (float64, so that 1e-30 still keeps every near-tie apart)
    scaled = (logits.double() - logits.double().max()) / temperature
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
        outside[0] = False
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs / probs.sum()


def verify(
    logits: Any,
    drafts: list[int],
    temperature: float,
    top_p: float,
    generator: Any = None,
    draft_probs: list[Any | None] | None = None,
) -> list[int]:
    """The tokens generated from one verification forward: accepted drafts, then one more.

    Args:
        logits: ``[len(drafts) + 1, V]``: the model's logits after the last token and after each draft.
        drafts: the drafted tokens, in order.
        temperature: 0 for greedy; else sampling from :func:`target_probs`.
        top_p: the nucleus for sampling.
        generator: the sequence's ``torch.Generator`` (its seed), or ``None``.
        draft_probs: per draft, the distribution ``[V]`` it was drawn from, ``None`` for a
            deterministic draft (one-hot); ``None``: all deterministic.

    Returns:
        Between 1 and ``len(drafts) + 1`` tokens.
    """
    import torch

    assert logits.shape[0] == len(drafts) + 1, "one row of logits per draft, and one after them"
    if temperature == 0:
        for position, draft in enumerate(drafts):
            best = int(torch.argmax(logits[position]))
            if best != draft:
                return [*drafts[:position], best]
        return [*drafts, int(torch.argmax(logits[len(drafts)]))]
    for position, draft in enumerate(drafts):
        p = target_probs(logits[position], temperature, top_p)
        q = draft_probs[position] if draft_probs is not None else None
        q_draft = 1.0 if q is None else float(q[draft])
        keep = min(1.0, float(p[draft]) / q_draft) if q_draft > 0 else 0.0
        if float(torch.rand(1, generator=generator, dtype=torch.float64)) < keep:
            continue
        if q is None:
            residual = p.clone()
            residual[draft] = 0.0
        else:
            residual = torch.clamp(p - q.double(), min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q: nothing is left to correct; p itself
            residual = p
        token = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return [*drafts[:position], token]
    last = target_probs(logits[len(drafts)], temperature, top_p)
    return [*drafts, int(torch.multinomial(last, 1, generator=generator))]
