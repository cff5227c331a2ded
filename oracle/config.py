"""Configurations shared by the oracle, the suite and every adapter.

These frozen dataclasses *are* the conventions of docs/spec.md §2: whoever builds a
layer from them (the reference implementation, a third-party adapter) must
mean the same thing by each field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

RopeStyle = Literal["interleaved", "half_split"]
ROPE_STYLES: tuple[RopeStyle, ...] = ("interleaved", "half_split")


class OracleInputError(ValueError):
    """The oracle was asked something outside its conventions (a suite bug)."""


@dataclass(frozen=True)
class RopeConfig:
    """RoPE at absolute position ``p`` rotates pair ``i`` by ``p * base**(-2i/r)``.

    ``style`` chooses the pairing: ``"interleaved"`` pairs features ``2i, 2i+1``
    (GPT-J, the course); ``"half_split"`` pairs ``i, i + r/2`` (GPT-NeoX,
    Llama's ``rotate_half``). Features at and past ``rotary_width`` (``r``) are
    not rotated. Positions ``>= max_positions`` are an error.

    The pairings are one rotation seen through a permutation of features:
    with ``perm[2i] = i`` and ``perm[2i+1] = i + r/2`` (and ``perm[j] = j``
    for ``j >= r``), ``half_split(x)[perm] == interleaved(x[perm])``. So a
    layer whose ``Wq``/``Wk`` rotary columns are permuted by ``perm`` in every
    head computes under ``interleaved`` exactly what the original computes
    under ``half_split`` (``tests/test_oracle.py`` checks both statements).
    """

    style: RopeStyle
    base: float
    rotary_width: int
    max_positions: int

    def __post_init__(self) -> None:
        if self.style not in ROPE_STYLES:
            raise OracleInputError(f"RoPE style must be one of {ROPE_STYLES}, got {self.style!r}")
        if not (isinstance(self.base, float) and math.isfinite(self.base) and self.base > 0.0):
            raise OracleInputError(f"RoPE base must be a finite positive float, got {self.base!r}")
        if not _is_count(self.rotary_width) or self.rotary_width % 2 != 0:
            raise OracleInputError(f"rotary width must be an even int >= 0, got {self.rotary_width!r}")
        if not _is_count(self.max_positions) or self.max_positions == 0:
            raise OracleInputError(f"max positions must be an int >= 1, got {self.max_positions!r}")

    def pair(self, i: int) -> tuple[int, int]:
        """The two feature indices rotated together as pair ``i``."""
        if self.style == "interleaved":
            return 2 * i, 2 * i + 1
        return i, i + self.rotary_width // 2


@dataclass(frozen=True, eq=False)
class AttentionWeights:
    """Row-vector projections ``y = x @ W`` of one attention layer.

    Shapes: ``wq [D, H*dh]``, ``wk [D, KV*dh]``, ``wv [D, KV*dh]``,
    ``wo [H*dh, D]``; query head ``h`` reads kv head ``h // (H // KV)``.
    """

    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    heads: int
    kv_heads: int

    def __post_init__(self) -> None:
        if not (_is_count(self.heads) and _is_count(self.kv_heads)) or self.kv_heads == 0:
            raise OracleInputError(f"heads and kv heads must be ints >= 1, got {self.heads}, {self.kv_heads}")
        if self.heads % self.kv_heads != 0:
            raise OracleInputError(f"heads {self.heads} must be a multiple of kv heads {self.kv_heads}")
        for name in ("wq", "wk", "wv", "wo"):
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.dtype != np.float64 or array.ndim != 2:
                raise OracleInputError(f"{name} must be a 2-D float64 array")
        model_width, query_width = self.wq.shape
        if query_width % self.heads != 0 or query_width == 0:
            raise OracleInputError(f"wq width {query_width} must be a positive multiple of heads {self.heads}")
        head_width = query_width // self.heads
        kv_shape = (model_width, self.kv_heads * head_width)
        expected = {"wk": kv_shape, "wv": kv_shape, "wo": (query_width, model_width)}
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise OracleInputError(f"{name} must have shape {shape}, got {getattr(self, name).shape}")

    @property
    def model_width(self) -> int:
        return int(self.wq.shape[0])

    @property
    def head_width(self) -> int:
        return int(self.wq.shape[1]) // self.heads

    @property
    def group_size(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
