"""The model's structure, read from transformers' own classes built on the meta device.

Building ``AutoModelForCausalLM.from_config`` with parameters on ``meta`` costs no weight
memory, and tells us, without re-implementing any architecture's rules, which layers hold
routed experts (the ``...experts`` modules), their sizes, and the in-memory name of every
backbone tensor. Buffers stay real (rotary frequencies are computed in ``__init__``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_EXPERTS_MODULE = re.compile(r"^(?:.+\.)?layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts$")


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Create every ``nn.Parameter`` on the meta device while the context is open (buffers stay real)."""
    from torch import nn

    original = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def build_meta_model(config: Any) -> Any:
    """``AutoModelForCausalLM.from_config(config)`` with parameters on meta (no weight memory)."""
    from transformers import AutoModelForCausalLM

    with parameters_on_meta():
        return AutoModelForCausalLM.from_config(config)


@dataclass(frozen=True)
class MoeLayout:
    """Where the routed experts are, and their sizes.

    ``experts_modules``: layer -> module path of that layer's experts (e.g. ``model.layers.3.mlp.experts``).
    """

    experts_modules: dict[int, str]
    num_experts: int
    hidden_size: int
    intermediate_size: int

    @property
    def moe_layers(self) -> list[int]:
        return sorted(self.experts_modules)


def moe_layout(model: Any, num_experts: int) -> MoeLayout:
    """Find the routed-expert modules of a (meta) model and read their sizes from ``down_proj``.

    ``down_proj`` is ``[E, H, I]`` for the SwiGLU family and ``[E, I, H]`` for GPT-OSS, told
    apart by ``config.hidden_size``.
    """
    modules: dict[int, str] = {}
    hidden = model.config.hidden_size
    intermediate = 0
    for name, module in model.named_modules():
        match = _EXPERTS_MODULE.match(name)
        if match and hasattr(module, "down_proj"):
            modules[int(match[1])] = name
            _, a, b = module.down_proj.shape
            intermediate = b if a == hidden else a
    return MoeLayout(modules, num_experts, hidden, intermediate)


def checkpoint_to_module_names(model: Any) -> Any:
    """Return ``f(checkpoint_key) -> module state_dict key`` using transformers' own renaming rules.

    Only renamings apply to backbone tensors (converters fuse experts, which are not backbone).
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, apply_renamings

    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    return lambda key: apply_renamings(key, renamings)


def backbone_state_keys(model: Any, layout: MoeLayout) -> set[str]:
    """State-dict keys of everything that is not a routed expert (parameters and persistent buffers)."""
    prefixes = tuple(f"{path}." for path in layout.experts_modules.values())
    return {key for key in model.state_dict() if not key.startswith(prefixes)}


def tied_keys(model: Any) -> set[str]:
    """Keys that transformers fills by tying (e.g. ``lm_head.weight`` when embeddings are tied)."""
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(text_config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def experts_modules(model: Any) -> dict[int, Any]:
    """layer -> its routed-experts module (original or dispatched)."""
    return {
        int(match[1]): module
        for name, module in model.named_modules()
        if (match := _EXPERTS_MODULE.match(name))
    }
