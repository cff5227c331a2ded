"""Vectorised RoPE in both pairings (docs/spec.md §2.3)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from .errors import InvalidRopeConfig, RopePositionOutOfRange
from .functions import FLOAT64_FUNCTIONS, Functions

STYLES = ("interleaved", "half_split")


@dataclass(frozen=True)
class RopeConfig:
    """Rotate pair ``i`` at absolute position ``p`` by ``p * base**(-2i/r)``.

    ``interleaved`` pairs features ``(2i, 2i+1)``; ``half_split`` pairs
    ``(i, i + r/2)``. Features at and past ``rotary_width`` are not rotated.
    """

    style: str
    base: float
    rotary_width: int
    max_positions: int

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise InvalidRopeConfig(f"style must be one of {STYLES}, got {self.style!r}")
        if not isinstance(self.base, float) or not math.isfinite(self.base) or self.base <= 0.0:
            raise InvalidRopeConfig(f"base must be a finite positive float, got {self.base!r}")
        if not _is_int(self.rotary_width) or self.rotary_width < 0 or self.rotary_width % 2:
            raise InvalidRopeConfig(f"rotary width must be an even int >= 0, got {self.rotary_width!r}")
        if not _is_int(self.max_positions) or self.max_positions < 1:
            raise InvalidRopeConfig(f"max positions must be an int >= 1, got {self.max_positions!r}")

    def same_as(self, other: RopeConfig) -> bool:
        """Exact equality; the base is compared bit for bit, never with a tolerance."""
        return (self.style == other.style
                and self.rotary_width == other.rotary_width
                and self.max_positions == other.max_positions
                and _bits(self.base) == _bits(other.base))

    def angles(self, positions: int | np.ndarray,
               functions: Functions = FLOAT64_FUNCTIONS) -> tuple[np.ndarray, np.ndarray]:
        """``cos`` and ``sin`` of every pair's angle at ``positions``: ``[r/2]`` or ``[T, r/2]``."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.max_positions):
            bad = int(positions.max() if positions.max() >= self.max_positions else positions.min())
            raise RopePositionOutOfRange(bad, self.max_positions)
        r = self.rotary_width
        inverse_frequency = self.base ** (-np.arange(0, r, 2, dtype=np.float64) / r)  # [r/2]
        theta = np.multiply.outer(positions, inverse_frequency)
        return functions.cos(theta), functions.sin(theta)

    def rotate_with(self, x: np.ndarray, angles: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Rotate ``x [..., dh]`` (or ``[..., T, dh]``) by ``angles(positions)``, which fix the rotary width."""
        cos, sin = angles
        r = 2 * cos.shape[-1]
        if self.style == "interleaved":
            a_index, b_index = slice(0, r, 2), slice(1, r, 2)
        else:
            a_index, b_index = slice(0, r // 2), slice(r // 2, r)
        a, b = x[..., a_index], x[..., b_index]
        rotated: np.ndarray = x.copy()
        rotated[..., a_index] = a * cos - b * sin
        rotated[..., b_index] = a * sin + b * cos
        return rotated


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
