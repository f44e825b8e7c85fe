"""Expert loads: how many tokens each expert of each layer received (docs/design.md, "Loads").

``{"layers": [{"layer": L, "counts": [c_0, ..., c_{E-1}]}], ...}`` plus optional header fields
(model, num_experts, top_k, num_tokens...), kept as ``meta``. Traces reduce to it, and so do the
real routing statistics in ``../shared/data/routing``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moeless.errors import PlanError


@dataclass
class Loads:
    """Per-layer token counts; every layer has the same number of experts."""

    layers: dict[int, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_experts(self) -> int:
        return len(next(iter(self.layers.values())))

    @property
    def top_k(self) -> int | None:
        value = self.meta.get("top_k")
        return int(value) if isinstance(value, int) and value > 0 else None

    def to_dict(self) -> dict[str, Any]:
        rows = [
            {"layer": layer, "counts": [float(c) for c in counts]}
            for layer, counts in sorted(self.layers.items())
        ]
        return self.meta | {"layers": rows}


def loads_from_dict(data: Any, source: str = "loads") -> Loads:
    """Validate and convert; raises :class:`PlanError` naming the first problem."""
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list) or not data["layers"]:
        raise PlanError(
            f'{source}: expected {{"layers": [{{"layer": L, "counts": [...]}}, ...]}} with at least one layer'
        )
    layers: dict[int, np.ndarray] = {}
    for row in data["layers"]:
        if not isinstance(row, dict) or "layer" not in row or "counts" not in row:
            raise PlanError(f"{source}: every layer needs 'layer' and 'counts'")
        layer, counts = row["layer"], row["counts"]
        if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
            raise PlanError(f"{source}: layer {layer!r} is not a non-negative integer")
        if layer in layers:
            raise PlanError(f"{source}: layer {layer} appears twice")
        if not isinstance(counts, list) or not counts:
            raise PlanError(f"{source}: layer {layer}: counts must be a non-empty list")
        if not all(isinstance(c, int | float) and not isinstance(c, bool) for c in counts):
            raise PlanError(f"{source}: layer {layer}: counts must be numbers")
        values = np.asarray(counts, dtype=np.float64)
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise PlanError(f"{source}: layer {layer}: counts must be finite and non-negative")
        layers[layer] = values
    widths = {len(v) for v in layers.values()}
    if len(widths) != 1:
        raise PlanError(f"{source}: layers disagree on the number of experts ({sorted(widths)})")
    declared = data.get("num_experts")
    if isinstance(declared, int) and declared != widths.pop():
        raise PlanError(f"{source}: num_experts {declared} does not match the counts")
    meta = {k: v for k, v in data.items() if k != "layers"}
    return Loads(dict(sorted(layers.items())), meta)


def load_loads(path: Path) -> Loads:
    """Read a loads JSON file."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"cannot read loads {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from None
    return loads_from_dict(data, str(path))


def shares(counts: np.ndarray) -> np.ndarray:
    """Counts as fractions of the layer's selections (uniform when the layer saw nothing)."""
    total = float(counts.sum())
    return counts / total if total > 0 else np.full(len(counts), 1.0 / len(counts))
