"""A minimal whole-model adapter (capability ``whole_model``, docs/adapters.md "Whole models"), written from scratch.

A Llama-family model in plain numpy over one unified store of cells -- a list: each cell a token's position,
its sequences, and per layer its key *before rotation* and its value. Keys are rotated when read, so a shift
only moves positions. Interleaved RoPE, GQA, a fixed number of cells; removals, copies (sharing the cells),
keeps and shifts; no per-sequence contexts, divides or saved states, and no claimed validation -- and it
says so in ``capabilities`` and ``model_policy``. A malformed batch it is handed is not judged if it accepts it
(the context is replaced); whatever it raises on must change nothing, so a batch is computed first and
committed last. Run it with::

    KVCACHE_IMPL=examples.minimal_model_adapter:make_adapter pytest properties/test_whole_model.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


class NoRoom(Exception):
    """The batch does not fit in the free cells."""


@dataclass
class Cell:
    position: int
    keys: list[np.ndarray]  # per layer [KV, dh], unrotated
    values: list[np.ndarray]  # per layer [KV, dh]
    sequences: set[int] = field(default_factory=set)


@dataclass
class Context:
    model: Any
    capacity: int
    sequences: int
    cells: list[Cell] = field(default_factory=list)

    def of(self, seq: int) -> list[Cell]:
        return [cell for cell in self.cells if seq in cell.sequences]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate(x: np.ndarray, position: int, base: float) -> np.ndarray:
    """Interleaved RoPE of ``x [heads, dh]`` at ``position``: pairs (2i, 2i+1) turned by position * base^(-2i/dh)."""
    dh = x.shape[-1]
    theta = position * base ** (-np.arange(0, dh, 2, dtype=np.float64) / dh)
    cos, sin = np.cos(theta), np.sin(theta)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


class MinimalModelAdapter:
    name = "example-minimal-model"
    version = "1.0"
    capabilities = frozenset({"whole_model", "float64", "rope_interleaved", "gqa", "fixed_capacity", "seq_remove",
                              "seq_copy", "seq_keep", "seq_shift"})
    model_policy: ClassVar[dict[str, Any]] = {"contexts": ["unified"], "shared_copies": True, "copy_unified": "merge"}

    def create_model(self, config: Any, weights: Any) -> Any:
        return config, weights

    def create_context(self, model: Any, config: Any) -> Context:
        return Context(model, config.cells, config.max_sequences)

    def context_cells(self, context: Context) -> int:
        return context.capacity

    def decode_batch(self, context: Context, batch: Any) -> np.ndarray:
        config, weights = context.model
        n = len(batch.tokens)
        if n > context.capacity - len(context.cells):
            raise NoRoom(f"{n} tokens, {context.capacity - len(context.cells)} free cells")
        dh, kv, group = config.head_width, config.kv_heads, config.heads // config.kv_heads
        new = [Cell(p, [], [], {s}) for p, s in zip(batch.positions, batch.sequences)]
        hidden = weights.embedding[list(batch.tokens)]  # [n, D]
        for layer in weights.layers:
            x = rms_norm(hidden, layer.attention_norm, config.norm_eps)
            q = (x @ layer.wq.T).reshape(n, config.heads, dh)
            for i, cell in enumerate(new):  # every new cell's key and value first: the batch is causal
                cell.keys.append((x[i] @ layer.wk.T).reshape(kv, dh))
                cell.values.append((x[i] @ layer.wv.T).reshape(kv, dh))
            attended = np.zeros_like(hidden)
            for i, (position, seq) in enumerate(zip(batch.positions, batch.sequences)):
                seen = [c for c in context.of(seq) + [c for c in new if seq in c.sequences] if c.position <= position]
                depth = len(new[i].keys) - 1
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
        context.cells.extend(new)  # committed last: a batch that raised left nothing behind
        wanted: np.ndarray = logits[[bool(w) for w in batch.logits]]
        return wanted

    def clear(self, context: Context) -> None:
        context.cells.clear()

    def seq_pos_min(self, context: Context, seq: int) -> int:
        return min((c.position for c in context.of(seq)), default=-1)

    def seq_pos_max(self, context: Context, seq: int) -> int:
        return max((c.position for c in context.of(seq)), default=-1)

    def can_shift(self, context: Context) -> bool:
        return True

    @staticmethod
    def _in(cell: Cell, p0: int, p1: int) -> bool:
        return (p0 < 0 or cell.position >= p0) and (p1 < 0 or cell.position < p1)

    def seq_remove(self, context: Context, seq: int, p0: int, p1: int) -> None:
        for cell in context.cells:
            if self._in(cell, p0, p1):
                cell.sequences = set() if seq < 0 else cell.sequences - {seq}
        context.cells = [cell for cell in context.cells if cell.sequences]

    def seq_copy(self, context: Context, src: int, dst: int, p0: int, p1: int) -> None:
        for cell in context.of(src):
            if self._in(cell, p0, p1):
                cell.sequences.add(dst)  # the same cell: no room used

    def seq_keep(self, context: Context, seq: int) -> None:
        context.cells = [cell for cell in context.cells if seq in cell.sequences]
        for cell in context.cells:
            cell.sequences = {seq}

    def seq_shift(self, context: Context, seq: int, p0: int, p1: int, delta: int) -> None:
        for cell in context.of(seq):
            if self._in(cell, p0, p1):
                cell.position += delta  # a shared cell moves for every sequence holding it
                if cell.position < 0:
                    cell.sequences = set()
        context.cells = [cell for cell in context.cells if cell.sequences]

    def error_kind(self, error: BaseException) -> str | None:
        return "full" if isinstance(error, NoRoom) else None


def make_adapter() -> MinimalModelAdapter:
    return MinimalModelAdapter()
