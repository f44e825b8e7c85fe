"""The optimiser's search space and its defaults, in one place.

``moeless plan --slo-tpot-ms`` searches the settings of :class:`SearchSpace`; :data:`DEFAULT_SEARCH`
holds the real defaults, which ``plan``, the demo, the benchmarks and ``serve``'s re-planner all
read from here. A user changes them with ``plan --search FILE`` (JSON, any subset of the fields);
``moeless plan --print-search`` prints the defaults as such a file. Why each default is what it is:
docs/planner.md ("The search space").
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from moeless.aws_limits import MAX_FUNCTION_MEMORY_MB
from moeless.errors import MoelessError
from moeless.planning.cost_model import EXPERT_DTYPES
from moeless.planning.quotas import DEFAULT_QUOTAS, AccountQuotas

# $ per cold start on the request path: 0, 1e-5 .. 10 in quarter decades, and infinity
PRICE_GRID: tuple[float, ...] = (0.0, *(10 ** (k / 4) for k in range(-20, 5)), math.inf)
STALL_STEPS = 4  # chunked prefill: the decode steps the stall probe averages, each beside a full chunk
MAX_UNIFORM_LEVEL = 4  # the highest uniform level judged with uniform_levels (x4 replicas: every level)


class SearchFileError(MoelessError):
    """A search file that cannot be read, or that names a setting wrongly."""


@dataclass(frozen=True)
class SearchSpace:
    """What the optimiser may choose among, and the insurances it sizes with.

    Structures (each combination is one candidate, its warmth sized per family):
      memory_mb: function memory sizes; empty: the smallest full vCPU that holds an expert and
        the next one up.
      replica_scales: factors on the planner's replicas (more split a prefill over more
        environments).
      packings: experts of consecutive layers per function.
      groups: co-activated experts of one layer per function, one bundled invoke.
      expert_dtypes: dtypes the experts may be chosen in besides the deployment's (fp16 and int8
        change the outputs: the user's call, never the optimiser's own).
      prefill_chunks: prompt tokens per engine step the optimiser may choose besides the
        deployment's (``null``: whole prompts).
      speculate: drafts per decoding sequence per forward the optimiser may choose besides the
        deployment's, where it has a drafter (``plan --draft-acceptance``); empty: 0 and every k
        up to the draft positions the acceptance gives rates for (MTP: 0 and 1). Without a
        drafter only 0, and a k above it is refused.
    Tiers (moeless; docs/planner.md, "Tiers"):
      host_shares: besides Lambda alone, plans whose backbone holds the experts that take this
        share of each layer's tokens (1.0: all of them, the hybrid node), on the instance that
        holds them.
      offload_rows: such plans also with their host experts deployed as functions, their rows going
        there in a layer of this many rows (tokens) or more (a prefill chunk's step), a decode
        batch's staying on the host.
      alternatives: also the fleet that holds the model, as a candidate like any other.
    Warmth and insurance:
      keep_warm: keep environments warm by pings as well as by provisioned concurrency.
      stall_bound: each structure must decode within the TPOT bound beside a prefill chunk.
      every_level_premium: take every level warm where it costs at most 1 + this times the
        structure's cheapest plan (``null``: not judged).
      warm_every_level: one plan per structure, every level a step can use warm, whatever it costs.
      uniform_levels: also judge every function warm to one level, 0 to 4.
      replan_s: the forecasting re-planner's interval, s (``null``: none); sized with it running.
    The account (docs/planner.md, "Account quotas"):
      account_concurrency: its concurrent executions; a candidate that needs more is left out.
      max_function_memory_mb: its function memory cap; a structure above it is left out.
    Speed:
      processes: processes that simulate candidates at once (0: one per CPU core).
      exhaustive: simulate every candidate even where a bound proves it cannot be chosen (the
        frontier needs every point).
    """

    memory_mb: tuple[int, ...] = ()
    replica_scales: tuple[int, ...] = (1, 4)
    packings: tuple[int, ...] = (1, 4)
    groups: tuple[int, ...] = (1,)
    expert_dtypes: tuple[str, ...] = ()
    prefill_chunks: tuple[int | None, ...] = ()
    speculate: tuple[int, ...] = ()
    host_shares: tuple[float, ...] = (0.5, 0.9, 1.0)
    offload_rows: tuple[int, ...] = (32,)
    alternatives: bool = True
    keep_warm: bool = True
    stall_bound: bool = True
    every_level_premium: float | None = 0.1
    warm_every_level: bool = False
    uniform_levels: bool = False
    replan_s: float | None = None
    account_concurrency: int = DEFAULT_QUOTAS.concurrency
    max_function_memory_mb: int = DEFAULT_QUOTAS.max_function_memory_mb
    processes: int = 0
    exhaustive: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not all(isinstance(v, int | float) and 0 < v <= 1 for v in self.host_shares):
            problems.append(f"host_shares: shares above 0 and at most 1, not {list(self.host_shares)}")
        for name in ("memory_mb", "replica_scales", "packings", "groups", "offload_rows"):
            values = getattr(self, name)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
                problems.append(f"{name}: positive integers, not {list(values)}")
        if any(not 128 <= m <= 10240 for m in self.memory_mb):
            problems.append(f"memory_mb: Lambda allows 128-10240 MB, not {list(self.memory_mb)}")
        if bad := [d for d in self.expert_dtypes if d not in EXPERT_DTYPES]:
            problems.append(f"expert_dtypes: {bad} (choose from {', '.join(EXPERT_DTYPES)})")
        if not all(c is None or (isinstance(c, int) and c >= 1) for c in self.prefill_chunks):
            problems.append(f"prefill_chunks: positive integers or null, not {list(self.prefill_chunks)}")
        if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in self.speculate):
            problems.append(f"speculate: drafts per forward, 0 or more, not {list(self.speculate)}")
        if self.every_level_premium is not None and not self.every_level_premium >= 0:
            problems.append(f"every_level_premium: 0 or more, or null, not {self.every_level_premium}")
        if self.replan_s is not None and not self.replan_s > 0:
            problems.append(f"replan_s: seconds above 0, or null, not {self.replan_s}")
        if self.account_concurrency < 1:
            problems.append(f"account_concurrency: 1 or more, not {self.account_concurrency}")
        if not 128 <= self.max_function_memory_mb <= MAX_FUNCTION_MEMORY_MB:
            problems.append(
                f"max_function_memory_mb: Lambda allows 128-{MAX_FUNCTION_MEMORY_MB}, "
                f"not {self.max_function_memory_mb}"
            )
        if self.processes < 0:
            problems.append(f"processes: 0 (one per core) or more, not {self.processes}")
        if not (self.replica_scales and self.packings and self.groups):
            problems.append("replica_scales, packings and groups: at least one value each")
        if self.warm_every_level and self.uniform_levels:
            problems.append(
                "warm_every_level or uniform_levels: the first sizes one plan per structure, the "
                "second adds to the plans priced level by level"
            )
        if self.warm_every_level and self.every_level_premium is not None:
            problems.append(
                "warm_every_level with every_level_premium: the first keeps every level warm whatever "
                "it costs, the second only where it costs at most that premium (set it to null)"
            )
        if problems:
            raise SearchFileError("search space: " + "; ".join(problems))

    @property
    def premium(self) -> float | None:
        """The every-level premium that applies (none where every level is kept warm anyway)."""
        return None if self.warm_every_level else self.every_level_premium

    @property
    def quotas(self) -> AccountQuotas:
        """The account's quotas every candidate must fit."""
        return AccountQuotas(self.account_concurrency, self.max_function_memory_mb)

    def to_json(self) -> str:
        """The settings as a search file (what ``plan --print-search`` prints)."""
        return json.dumps(asdict(self), indent=2)

    def with_overrides(self, **changes: Any) -> SearchSpace:
        """These settings with ``changes`` (validated again)."""
        return replace(self, **changes)


DEFAULT_SEARCH = SearchSpace()


def load_search(path: Path, base: SearchSpace = DEFAULT_SEARCH) -> SearchSpace:
    """``base`` with the settings a JSON search file names; unknown names and wrong types are refused."""
    try:
        given = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SearchFileError(f"{path}: cannot read the search file: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise SearchFileError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(given, dict):
        raise SearchFileError(f"{path}: a JSON object of settings, not {type(given).__name__}")
    known = {f.name: f for f in fields(SearchSpace)}
    if unknown := sorted(set(given) - set(known)):
        raise SearchFileError(f"{path}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(known)})")
    changes: dict[str, Any] = {}
    for name, value in given.items():
        default = getattr(DEFAULT_SEARCH, name)
        if isinstance(default, tuple):
            if not isinstance(value, list):
                raise SearchFileError(f"{path}: {name} is a list, not {value!r}")
            value = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise SearchFileError(f"{path}: {name} is true or false, not {value!r}")
        elif name in ("every_level_premium", "replan_s"):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise SearchFileError(f"{path}: {name} is a number or null, not {value!r}")
        elif isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int)):
            raise SearchFileError(f"{path}: {name} is an integer, not {value!r}")
        changes[name] = value
    try:
        return replace(base, **changes)
    except SearchFileError as exc:
        raise SearchFileError(f"{path}: {exc}") from exc
