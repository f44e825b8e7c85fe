"""Lazy, tensor-by-tensor access to a Hugging Face safetensors checkpoint.

Packaging Mixtral-8x7B (about 90 GB) must not need 90 GB of RAM, so nothing here loads a
whole shard: headers are parsed up front (to catch missing or truncated shards before any
work starts) and each tensor, or one expert's slice of a fused tensor, is read on demand
through ``safetensors.safe_open``, which memory-maps the file.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moeless.errors import CheckpointError

if TYPE_CHECKING:
    import torch

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: shard file, dtype tag, shape and byte range within the data region."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse a safetensors header and check the file is long enough to hold every tensor.

    Raises:
        CheckpointError: the file is unreadable, not safetensors, or truncated.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"shard {path} is truncated or empty ({size} bytes)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_HEADER_BYTES or 8 + header_len > size:
                raise CheckpointError(f"shard {path} is not a valid safetensors file (bad header length)")
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read shard {path}: {exc}") from exc
    tensors: dict[str, TensorInfo] = {}
    data_bytes = size - 8 - header_len
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        if end > data_bytes:
            raise CheckpointError(
                f"shard {path} is truncated: tensor {name!r} ends at byte {end} of the data region "
                f"but the file holds only {data_bytes} data bytes"
            )
        tensors[name] = TensorInfo(path.name, entry["dtype"], tuple(entry["shape"]), begin, end)
    return tensors


class LazyCheckpoint:
    """A checkpoint folder (single ``model.safetensors`` or sharded with its index).

    Args:
        model_dir: folder holding ``config.json`` and safetensors weights.

    Raises:
        CheckpointError: the folder, its config, or a shard is missing or corrupt.
    """

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise CheckpointError(f"model directory {self.model_dir} does not exist")
        if not (self.model_dir / "config.json").is_file():
            raise CheckpointError(
                f"{self.model_dir} has no config.json: not a Hugging Face checkpoint folder"
            )
        self.tensors: dict[str, TensorInfo] = {}
        for shard in self._shard_names():
            path = self.model_dir / shard
            if not path.is_file():
                raise CheckpointError(
                    f"shard {shard} listed in {INDEX_NAME} is missing from {self.model_dir}"
                )
            self.tensors.update(read_safetensors_header(path))
        self._check_index_covered()

    def _shard_names(self) -> list[str]:
        index_path = self.model_dir / INDEX_NAME
        if index_path.is_file():
            try:
                self._weight_map: dict[str, str] | None = json.loads(index_path.read_text())["weight_map"]
            except (ValueError, KeyError) as exc:
                raise CheckpointError(f"{index_path} is not a valid safetensors index: {exc}") from exc
            return sorted(set(self._weight_map.values()))
        self._weight_map = None
        if (self.model_dir / SINGLE_NAME).is_file():
            return [SINGLE_NAME]
        shards = sorted(p.name for p in self.model_dir.glob("*.safetensors"))
        if shards:
            return shards
        if any(self.model_dir.glob("*.bin")) or any(self.model_dir.glob("*.pt")):
            raise CheckpointError(
                f"{self.model_dir} holds only PyTorch pickle weights (.bin/.pt); moeless reads safetensors. "
                "Convert with `model.save_pretrained(dir, safe_serialization=True)`"
            )
        raise CheckpointError(f"{self.model_dir} holds no safetensors weights")

    def _check_index_covered(self) -> None:
        if self._weight_map is None:
            return
        missing = [name for name in self._weight_map if name not in self.tensors]
        if missing:
            raise CheckpointError(
                f"{len(missing)} tensors listed in {INDEX_NAME} are missing from their shards "
                f"(first: {missing[0]!r}); the checkpoint is incomplete"
            )

    def config_dict(self) -> dict[str, Any]:
        """The raw ``config.json``."""
        return json.loads((self.model_dir / "config.json").read_text())

    def names(self) -> list[str]:
        """Every tensor name, sorted."""
        return sorted(self.tensors)

    def read(self, name: str) -> torch.Tensor:
        """Read one whole tensor in its stored dtype."""
        from safetensors import safe_open

        info = self.tensors[name]
        with safe_open(self.model_dir / info.file, framework="pt") as handle:
            return handle.get_tensor(name)

    def read_row(self, name: str, row: int) -> torch.Tensor:
        """Read ``tensor[row]`` of a fused ``[E, ...]`` tensor without reading the others."""
        from safetensors import safe_open

        info = self.tensors[name]
        with safe_open(self.model_dir / info.file, framework="pt") as handle:
            return handle.get_slice(name)[row : row + 1][0]

    def fingerprint(self, names: list[str]) -> str:
        """A digest that changes when any named tensor's file, placement or content size changes.

        Used to decide whether an artifact from an earlier run was made from the same weights.
        Shard size and modification time stand in for content, which would cost a full read.
        """
        digest = hashlib.sha256()
        for name in sorted(names):
            info = self.tensors[name]
            stat = (self.model_dir / info.file).stat()
            digest.update(f"{name}|{info}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
        return digest.hexdigest()
