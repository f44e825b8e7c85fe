"""The decoding sequences of an engine step as one left-padded batch: one forward for all of them.

Each row of the batch is one sequence. Its cached keys and values are right-aligned on a shared
timeline of ``T`` positions (the longest row's length); the shorter rows are padded on the left
with zeros that a 2-D attention mask (0 = padding) hides, and every row gets explicit position
ids (its own length), so rotary embeddings see the positions ``generate`` would give it. This
is the layout ``generate`` itself uses for a left-padded batch, so transformers' own mask code
(causal, sliding-window, attention sinks) handles it for every architecture.

Rows change only between steps: sequences that finished leave, sequences that were prefilled
(alone, each with its own one-row cache) join. Both rebuild the batch once, with one copy of
the cache (:meth:`DecodeBatch.rebuild`); a plain decode step appends one column in place.

Shapes: per cache layer ``keys [B, heads, n, head_dim]``, where ``n = T`` for full attention
and ``n = min(T, window - 1)`` for a sliding-window layer (transformers keeps only what the next
token can see); ``mask [B, T]``; ``lengths[b]`` real tokens of row ``b``.

Padded positions exist only in the cache, never among a step's query tokens (each row decodes
one real token, or with speculation its last token and its drafts, the same number in every row),
so no padding row ever reaches the routers or the expert functions.

**Speculation** (:mod:`moeless.serving.speculation`): a row's step may carry ``m`` tokens; after
the forward each row keeps the columns of the tokens it accepted (:meth:`DecodeBatch.advanced`
with ``kept``) and the batch is re-stacked without the rest, so every row is again right-aligned
and exactly what decoding one token per forward would have cached. Sliding-window layers record
the columns they would drop (``activate_past_recording``) during such a forward, so a rejected
token never takes an older column out of the window.
"""

from __future__ import annotations

from typing import Any

# One row's cache: per model layer, (keys [heads, n, d], values [heads, n, d]) or None (unused layer).
RowCache = list[tuple[Any, Any] | None]


def row_of(cache: Any, row: int, length: int, drop: int = 0) -> RowCache:
    """Views of row ``row``'s real entries in a (batch) cache whose rows are right-aligned, without
    its last ``drop`` (the columns of rejected drafts)."""
    parts: RowCache = []
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys.numel() == 0:
            parts.append(None)
            continue
        stored = layer.keys.shape[-2]
        n = min(length, stored)
        end = stored - drop
        parts.append((layer.keys[row, :, stored - n : end, :], layer.values[row, :, stored - n : end, :]))
    return parts


def stack_rows(config: Any, rows: list[RowCache], lengths: list[int]) -> tuple[Any, Any]:
    """A transformers ``DynamicCache`` holding ``rows`` left-padded to one timeline, and its mask.

    Returns ``(cache, mask [B, T])`` with ``T = max(lengths)``; the cache has the layer kinds the
    model itself would create (``DynamicCache(config=...)``, sliding-window layers included).
    """
    import torch
    from transformers import DynamicCache

    assert rows and len(rows) == len(lengths), "one length per row, at least one row"
    timeline = max(lengths)
    cache = DynamicCache(config=config)
    for index, layer in enumerate(cache.layers):
        parts = [row[index] if index < len(row) else None for row in rows]
        if any(part is None for part in parts):
            assert all(part is None for part in parts), f"layer {index} is cached for some rows only"
            continue
        present = [part for part in parts if part is not None]
        keys = _left_padded([k for k, _ in present])
        values = _left_padded([v for _, v in present])
        layer.update(keys, values)
        if getattr(layer, "is_sliding", False):
            layer.cumulative_length = timeline  # the window keeps fewer columns than the timeline
    device = next(part[0].device for part in rows[0] if part is not None)
    mask = torch.zeros(len(rows), timeline, dtype=torch.long, device=device)
    for b, length in enumerate(lengths):
        mask[b, timeline - length :] = 1
    return cache, mask


def _left_padded(parts: list[Any]) -> Any:
    """``[heads, n_b, d]`` tensors -> ``[B, heads, max n_b, d]``, each right-aligned, zeros before."""
    width = max(part.shape[-2] for part in parts)
    heads, _, dim = parts[0].shape
    out = parts[0].new_zeros(len(parts), heads, width, dim)
    for b, part in enumerate(parts):
        out[b, :, width - part.shape[-2] :, :] = part
    return out


class DecodeBatch:
    """The sequences that decode together, their stacked cache, mask and lengths.

    Args:
        config: the model's config (for the cache's layer kinds).
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.members: list[Any] = []  # whatever the engine tracks per row (its sequences)
        self.lengths: list[int] = []
        self.cache: Any = None
        self.mask: Any = None

    def rebuild(self, keep: list[Any], joining: list[tuple[Any, Any, int]]) -> None:
        """Keep the members in ``keep`` (in their order), then add ``(member, one-row cache, length)``.

        One copy of every kept and joining row's cache; nothing happens when nothing changes.
        """
        if not joining and len(keep) == len(self.members):
            return
        position = {id(member): b for b, member in enumerate(self.members)}
        assert all(id(member) in position for member in keep), "kept members must already be in the batch"
        rows = [row_of(self.cache, position[id(m)], self.lengths[position[id(m)]]) for m in keep]
        lengths = [self.lengths[position[id(m)]] for m in keep]
        for _, cache, length in joining:
            rows.append(row_of(cache, 0, length))
            lengths.append(length)
        self.members = [*keep, *(member for member, _, _ in joining)]
        self.lengths = lengths
        if rows:
            self.cache, self.mask = stack_rows(self.config, rows, lengths)
        else:
            self.cache = self.mask = None

    def inputs(self, rows: list[list[int]], device: Any, keep_past: bool = False) -> dict[str, Any]:
        """The batched forward's arguments: each row's new tokens (as many in every row: its last
        token, then any drafts) after its own cache. ``keep_past``: a :meth:`trim` may follow
        even a one-token forward (a drafter's own batch)."""
        import torch

        assert len(rows) == len(self.members), "one row of tokens per member"
        width = len(rows[0])
        assert width >= 1 and all(len(row) == width for row in rows), "as many tokens in every row"
        if width > 1 or keep_past:  # rejected tokens must not push older columns out of a window
            for layer in self.cache.layers:
                if getattr(layer, "is_sliding", False):
                    layer.activate_past_recording()
        ones = torch.ones(len(self.members), width, dtype=self.mask.dtype, device=self.mask.device)
        return {
            "input_ids": torch.tensor(rows, device=device),
            "attention_mask": torch.cat([self.mask, ones], dim=1).to(device),
            "position_ids": torch.tensor(
                [[n + i for i in range(width)] for n in self.lengths], device=device
            ),
            "past_key_values": self.cache,
        }

    def advanced(self, inputs: dict[str, Any], kept: list[int] | None = None, settle: bool = True) -> None:
        """After the forward on ``inputs``: every row's cache grew by its tokens, of which row ``b``
        keeps the first ``kept[b]`` (default: all); the others' columns are dropped (one copy of
        the cache, only when some row keeps fewer than it computed). ``settle=False`` leaves sliding
        windows holding what they would drop, for a :meth:`trim` after more forwards."""
        width = inputs["input_ids"].shape[1]
        kept = kept if kept is not None else [width] * len(self.lengths)
        assert len(kept) == len(self.lengths) and all(1 <= k <= width for k in kept), (
            "each row keeps 1..width"
        )
        self.mask = inputs["attention_mask"]
        self.lengths = [n + width for n in self.lengths]
        self.trim([width - k for k in kept], settle)

    def trim(self, drops: list[int], settle: bool = True) -> None:
        """Drop the last ``drops[b]`` cached tokens of each row ``b`` (one copy of the cache when
        any is dropped; otherwise sliding windows only go back to their own width)."""
        assert len(drops) == len(self.lengths) and all(
            0 <= d < n for d, n in zip(drops, self.lengths, strict=True)
        )
        if not any(drops):
            for layer in self.cache.layers if settle else ():
                if getattr(layer, "record_past", False):
                    layer.crop(0)  # back to the window's columns
                    layer.record_past = False
            return
        rows = [row_of(self.cache, b, n, d) for b, (n, d) in enumerate(zip(self.lengths, drops, strict=True))]
        self.lengths = [n - d for n, d in zip(self.lengths, drops, strict=True)]
        self.cache, self.mask = stack_rows(self.config, rows, self.lengths)

    def clear(self) -> None:
        """Drop every row (after a failed forward left the cache inconsistent)."""
        self.members, self.lengths, self.cache, self.mask = [], [], None, None
