"""A minimal windowed whole-model adapter (docs/adapters.md "Whole models", "Windowed stores"), written from scratch.

A Llama-family model in plain numpy whose every layer is windowed (``sliding_window``: a token at ``q`` sees the
cells of its sequence at ``q - W < p <= q``) and keeps sink tokens (``attention_sinks``: the cells at positions
below ``S`` stay visible to every later token). Each sequence has its own store (per-sequence contexts only), and
the store is a ring: after every batch it drops each cell no later token of its sequence can see -- older than the
window, not a sink, not the sequence's last cell -- so it holds the last ``W - 1`` positions, the newest and the
sinks. ``seq_pos_min`` reports what it holds, and it declares so: ``window_cells: visible``. A ring cannot bring a
dropped cell back, so once a sequence has held ``W`` tokens it refuses a removal to the end that would leave some of
its cells (``window_removal: until_full``); removing all of them always works. It claims no validation and no fixed
capacity. Run it with::

    KVCACHE_IMPL=examples.minimal_windowed_model_adapter:make_adapter pytest properties/test_whole_model.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from examples.minimal_model_adapter import rms_norm, rotate


class NoRoom(Exception):
    """The batch does not fit in its sequence's free cells."""


class CannotRestore(Exception):
    """A removal that would need cells the ring already dropped."""


@dataclass
class Cell:
    position: int
    keys: list[np.ndarray] = field(default_factory=list)  # per layer [KV, dh], unrotated
    values: list[np.ndarray] = field(default_factory=list)  # per layer [KV, dh]


@dataclass
class Context:
    model: Any
    capacity: int  # cells of each sequence's ring
    sinks: int
    rings: list[list[Cell]]
    filled: set[int] = field(default_factory=set)  # sequences that held W tokens since they were last empty


class MinimalWindowedModelAdapter:
    name = "example-minimal-windowed-model"
    version = "1.0"
    capabilities = frozenset({"whole_model", "float64", "rope_interleaved", "gqa", "sliding_window",
                              "attention_sinks", "seq_remove"})
    model_policy: ClassVar[dict[str, Any]] = {"contexts": ["per_sequence"], "window_cells": "visible",
                                              "window_removal": "until_full"}

    def create_model(self, config: Any, weights: Any) -> Any:
        return config, weights

    def create_context(self, model: Any, config: Any) -> Context:
        return Context(model, config.cells // config.max_sequences, config.sinks,
                       [[] for _ in range(config.max_sequences)])

    def context_cells(self, context: Context) -> int:
        return context.capacity

    def _sees(self, context: Context, query: int, position: int) -> bool:
        window = context.model[0].window
        return position <= query and (window is None or query - position < window or position < context.sinks)

    def decode_batch(self, context: Context, batch: Any) -> np.ndarray:
        config, weights = context.model
        n = len(batch.tokens)
        for seq in set(batch.sequences):
            count = list(batch.sequences).count(seq)
            if count > context.capacity - len(context.rings[seq]):
                raise NoRoom(f"{count} tokens, {context.capacity - len(context.rings[seq])} free cells")
        dh, kv, group = config.head_width, config.kv_heads, config.heads // config.kv_heads
        new = [Cell(int(p)) for p in batch.positions]
        hidden = weights.embedding[list(batch.tokens)]  # [n, D]
        for depth, layer in enumerate(weights.layers):
            x = rms_norm(hidden, layer.attention_norm, config.norm_eps)
            q = (x @ layer.wq.T).reshape(n, config.heads, dh)
            for i, cell in enumerate(new):  # every new cell's key and value first: the batch is causal
                cell.keys.append((x[i] @ layer.wk.T).reshape(kv, dh))
                cell.values.append((x[i] @ layer.wv.T).reshape(kv, dh))
            attended = np.zeros_like(hidden)
            for i, (position, seq) in enumerate(zip(batch.positions, batch.sequences)):
                mine = context.rings[seq] + [c for c, s in zip(new, batch.sequences) if s == seq]
                seen = [c for c in mine if self._sees(context, position, c.position)]  # by position, not by slot
                keys = np.stack([rotate(c.keys[depth], c.position, config.rope_base) for c in seen])  # [m, KV, dh]
                values = np.stack([c.values[depth] for c in seen])
                query = rotate(q[i], position, config.rope_base)  # [H, dh]; head h reads kv head h // group
                scores = np.einsum("hd,mhd->hm", query, np.repeat(keys, group, axis=1)) / np.sqrt(dh)
                mix = np.exp(scores - scores.max(axis=1, keepdims=True))
                mix /= mix.sum(axis=1, keepdims=True)
                attended[i] = np.einsum("hm,mhd->hd", mix, np.repeat(values, group, axis=1)).reshape(-1) @ layer.wo.T
            hidden = hidden + attended
            h = rms_norm(hidden, layer.ffn_norm, config.norm_eps)
            gate = h @ layer.w_gate.T
            hidden = hidden + (gate / (1 + np.exp(-gate)) * (h @ layer.w_up.T)) @ layer.w_down.T
        output = weights.embedding if weights.output is None else weights.output
        logits = rms_norm(hidden, weights.output_norm, config.norm_eps) @ output.T
        for cell, seq in zip(new, batch.sequences):  # committed last: a batch that raised left nothing behind
            context.rings[seq].append(cell)
        for seq in set(batch.sequences):
            self._wrap(context, seq)
        wanted: np.ndarray = logits[[bool(w) for w in batch.logits]]
        return wanted

    def _wrap(self, context: Context, seq: int) -> None:
        """Drop every cell no later token of ``seq`` sees: older than the window, not a sink, not the last."""
        window, ring = context.model[0].window, context.rings[seq]
        if window is None or not ring:
            return
        if len(ring) >= window:
            context.filled.add(seq)
        top = max(c.position for c in ring)
        kept = [c for c in ring if c.position >= top + 2 - window or c.position < context.sinks or c.position == top]
        if len(kept) < len(ring):
            context.filled.add(seq)
        context.rings[seq] = kept

    def clear(self, context: Context) -> None:
        for ring in context.rings:
            ring.clear()
        context.filled.clear()

    def seq_pos_min(self, context: Context, seq: int) -> int:
        return min((c.position for c in context.rings[seq]), default=-1)

    def seq_pos_max(self, context: Context, seq: int) -> int:
        return max((c.position for c in context.rings[seq]), default=-1)

    def can_shift(self, context: Context) -> bool:
        return False

    def seq_remove(self, context: Context, seq: int, p0: int, p1: int) -> None:
        low = max(p0, 0)
        for one in range(len(context.rings)) if seq < 0 else [seq]:
            left = [c for c in context.rings[one] if c.position < low]
            if p1 < 0 and left and one in context.filled:
                raise CannotRestore(f"sequence {one} has wrapped its ring: a removal to the end cannot be undone")
        for one in range(len(context.rings)) if seq < 0 else [seq]:
            ring = context.rings[one]
            context.rings[one] = [c for c in ring if not (c.position >= low and (p1 < 0 or c.position < p1))]
            if not context.rings[one]:
                context.filled.discard(one)  # an empty sequence starts anew

    def error_kind(self, error: BaseException) -> str | None:
        return {NoRoom: "full", CannotRestore: "refused"}.get(type(error))


def make_adapter() -> MinimalWindowedModelAdapter:
    return MinimalWindowedModelAdapter()
