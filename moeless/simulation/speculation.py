"""How many drafted tokens a verification forward keeps: the acceptance the simulator replays.

With speculative decoding (``moeless/serving/generation.py``) each decoding sequence carries k
drafted tokens into the step's batched forward, and keeps them position by position: draft i is
only tried if drafts 1..i-1 were kept. :class:`Acceptance` is that process as a distribution: the
conditional acceptance of each draft position, measured from served counters
(:meth:`Acceptance.from_counters`) or a published figure (:data:`MTP_ACCEPTANCE`).

Glossary: a *verification forward* is one sequence's k + 1 token rows in one step's forward; it
generates 1 + (drafts accepted) tokens; *tokens per forward* is their mean,
:meth:`Acceptance.expected_tokens`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moeless.errors import SimulationError

# The forms a CLI value takes (the one place they are named, for every error that lists them).
FORMS = (
    "mtp (the model's published MTP figure), one rate (0.85), a rate per draft position "
    "(0.8,0.6,0.5), or a JSON file of a served engine's counters (draft_tried_i, draft_accepted_i)"
)


@dataclass(frozen=True)
class Acceptance:
    """Conditional acceptance per draft position: ``rates[i - 1]`` is the chance draft i is kept
    given drafts 1..i-1 were; positions past ``rates`` are never kept (k is capped at their
    number). ``carry[i - 1]``: the chance the drafter fills position i given it filled i - 1 and
    the sequence has room (a drafter that stops short: no lookup match, an unsure draft model);
    empty: it always fills every position (a multi-token-prediction module). Only filled
    positions cost rows in the MoE layers. ``source`` says where the figures come from."""

    rates: tuple[float, ...]
    source: str
    carry: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.rates:
            raise SimulationError("an acceptance needs a rate for at least one draft position")
        for name, values in (("acceptance", self.rates), ("carry", self.carry)):
            if not all(isinstance(r, int | float) and 0.0 <= r <= 1.0 for r in values):
                raise SimulationError(f"{name} rates are between 0 and 1, not {list(values)}")

    @classmethod
    def from_counters(cls, counters: Mapping[str, float], source: str) -> Acceptance:
        """The acceptance a served engine measured: ``draft_accepted_i / draft_tried_i`` for each
        position i = 1, 2, ... it tried, and ``draft_carried_i / draft_room_i`` where it counted
        them (its ``ServingStats`` counters)."""

        def ratios(numerator: str, denominator: str) -> tuple[float, ...]:
            found = []
            position = 1
            while (below := float(counters.get(f"{denominator}_{position}", 0))) > 0:
                found.append(float(counters.get(f"{numerator}_{position}", 0)) / below)
                position += 1
            return tuple(found)

        rates = ratios("draft_accepted", "draft_tried")
        if not rates:
            raise SimulationError(
                f"{source}: no draft was tried (no draft_tried_1 counter above 0): the engine served "
                "without speculation, or served nothing"
            )
        return cls(rates, source, ratios("draft_carried", "draft_room"))

    @classmethod
    def parse(cls, text: str, model: str) -> Acceptance:
        """A CLI value (:data:`FORMS`) for ``model`` (the preset's name, for ``mtp``)."""
        value = text.strip()
        if value.lower() == "mtp":
            if model not in MTP_ACCEPTANCE:
                raise SimulationError(
                    f"{model} has no multi-token prediction module with a published acceptance "
                    f"(only {', '.join(MTP_ACCEPTANCE)} does): give the acceptance as {FORMS}"
                )
            return MTP_ACCEPTANCE[model]
        if value.endswith(".json") or Path(value).is_file():
            return cls.from_counters(_counters(Path(value)), f"served counters in {value}")
        try:
            rates = tuple(float(part) for part in value.split(","))
        except ValueError:
            raise SimulationError(f"{text!r} is not an acceptance: give {FORMS}") from None
        return cls(rates, f"given: {value}")

    def _carry(self, position: int) -> float:
        """The chance position ``position`` (0-based) is filled given the one before was."""
        if not self.carry:
            return 1.0
        return self.carry[position] if position < len(self.carry) else 0.0

    def expected_tokens(self, k: int) -> float:
        """Tokens one verification forward with room for ``k`` drafts generates on average: 1 + the
        sum over i <= k of the chance that drafts 1..i are all filled and kept."""
        total, kept = 1.0, 1.0
        for position, rate in enumerate(self.rates[:k]):
            kept *= rate * self._carry(position)
            total += kept
        return total

    def carried(self, k: int, rng: np.random.Generator) -> int:
        """How many of ``k`` positions with room a sequence fills with drafts (a draw)."""
        filled = 0
        while filled < k and rng.random() < self._carry(filled):
            filled += 1
        return filled

    def accepted(self, k: int, rng: np.random.Generator) -> int:
        """How many of ``k`` carried drafts one verification forward keeps (a draw)."""
        kept = 0
        for rate in self.rates[:k]:
            if rng.random() >= rate:
                break
            kept += 1
        return kept

    def describe(self) -> str:
        """One line: the rates and where they come from."""
        filled = f", filled {', '.join(f'{c:.3g}' for c in self.carry)}" if self.carry else ""
        return (
            f"acceptance {', '.join(f'{r:.3g}' for r in self.rates)}{filled} per draft position: "
            f"{self.source}"
        )

    def to_json(self) -> dict[str, Any]:
        """As a plan records it (``params.deployment.draft_acceptance``)."""
        recorded: dict[str, Any] = {"rates": list(self.rates), "source": self.source}
        return recorded | ({"carry": list(self.carry)} if self.carry else {})

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Acceptance:
        """What :meth:`to_json` wrote (``carry`` may be absent: every position filled)."""
        try:
            return cls(
                tuple(float(r) for r in value["rates"]),
                str(value["source"]),
                tuple(float(c) for c in value.get("carry") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SimulationError(f"a recorded draft acceptance needs rates and a source: {exc}") from None


def _counters(path: Path) -> dict[str, float]:
    """The counters in ``path``: a ``ServingStats.snapshot()`` (its ``counters``) or the counters alone."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise SimulationError(f"{path}: cannot read the counters: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SimulationError(f"{path}: not JSON: {exc}") from None
    counters = data.get("counters", data) if isinstance(data, dict) else None
    if not isinstance(counters, dict):
        raise SimulationError(f"{path}: a JSON object of counters (or a snapshot holding one)")
    return counters


# DeepSeek-V3 technical report (arXiv 2412.19437), section 5.4.3 "Multi-Token Prediction
# Evaluation": "the acceptance rate of the second token prediction ranges between 85% and 90%",
# giving 1.8x the tokens per second; its one MTP module drafts one token. The conservative end.
MTP_ACCEPTANCE = {
    "deepseek-v3": Acceptance(
        (0.85,),
        "DeepSeek-V3's MTP module, one draft: 85-90% acceptance of the second token (DeepSeek-V3 "
        "technical report, arXiv 2412.19437, section 5.4.3), the conservative end",
    ),
}
