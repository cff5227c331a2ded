"""What a low-precision cache stores: rows rounded to a storage format under a scale rule.

Not ground truth: the naive baseline a quantized cache is judged against
(``properties/tolerance.py``) is the oracle's computation with every stored
key and value row replaced by exactly what such a cache stores. The
rounding is written once here, in float64 numpy, from the definitions:

- a float format (``float16``, ``bfloat16``, ``float8_e4m3fn``) rounds to
  nearest; with a scale ``s`` it stores ``round(x / s)`` and reads back
  ``round(x / s) * s``; values past the format's largest finite number
  saturate to it;
- an integer format (``int8``, ``int4``) is symmetric: ``s = amax / qmax``,
  stored ``clip(rint(x / s), -qmax, qmax)``, read back times ``s``;
- the scale is one number for the whole tensor (``per_tensor``), one per kv
  head and feature over batch and positions (``per_channel``), or none
  (``none``, float formats only);
- it is ``recomputed`` from every row held, or ``frozen`` at the cache's
  first update after creation or reset (its calibration rows);
- an unsigned format (``uint8``, ``uint4``, ``uint3``, ``uint2``) is affine, one
  scale and zero point for each ``group`` of consecutive features of each
  token (``per_group``, as HQQ and KIVI store): the group's minimum ``lo`` and
  step ``s = max((hi - lo) / levels, min_step)`` (``levels = 2**bits - 1``; a
  group of equal values has step ``min_step``, or 1), stored
  ``clip(rint((x - lo) / s), 0, levels)``, read back ``lo + q * s``;
- or, with ``zero_point: level``, the zero point on a level so that 0 is
  exact (PyTorch's and torchao's asymmetric rule): the range extended to
  hold 0, ``lo = min(min, 0)``, ``hi = max(max, 0)``, the step as above,
  the zero point ``z = rint(-lo / s)``, stored
  ``clip(rint(x / s) + z, 0, levels)``, read back ``(q - z) * s``. The
  grid is ``lo`` moved by less than half a step, so the far end of the
  group may be clipped: every element is within half a step all the same;
- or, with ``zero_point: extreme``, the extreme of larger magnitude exact and
  0 on a level, the range not widened (mlx's ``mx.quantize``, affine mode):
  the step ``s`` as above; the extreme ``e`` (``lo`` if ``|lo| > |hi|``, else
  ``hi``) is ``k = rint(|e| / s)`` steps from 0; where ``k > 0`` the step
  becomes ``|e| / k``, a value is stored ``clip(rint((x - e) / t), 0, levels)``
  with ``t = -e / k`` (the grid runs from ``e`` towards the other end) and
  read back ``e + q * t``; where ``k = 0`` the group reads back as 0. The
  far end of a mixed-sign group may fall short of the grid by
  ``levels * (k - |e| / s) / (|e| / s)`` steps: under one, exactly one
  where ``hi = -lo``; every other element is within half a step;
- a block format (llama.cpp's ``q8_0``, ``q4_0``) has one scale ``d`` for each
  block of 32 consecutive features of each token (``per_block``), itself
  stored in float16: ``q8_0`` takes ``d = amax / 127`` and stores
  ``round(x / d)``; ``q4_0`` takes ``d`` = the block's value of largest
  magnitude (the first, if two tie) over -8 and stores
  ``min(15, floor(x / d + 8.5))``, read back ``(q - 8) * d``: the value of
  largest magnitude is exact. Both round half away from zero, as C's
  ``roundf``, and quantize with the unrounded ``d``, as llama.cpp does.

``StorageFormat.error_bounds`` is what any correct store may err by at each element, whatever its own
arithmetic: a whole model's cache is judged by it (``rounding.EstimatedStorage``, docs/spec.md §15.6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

FLOAT_FORMATS = ("float16", "bfloat16", "float8_e4m3fn")
INTEGER_FORMATS = {"int8": 127, "int4": 7}
AFFINE_FORMATS = {"uint8": 255, "uint4": 15, "uint3": 7, "uint2": 3}  # levels above the group's minimum
BLOCK_FORMATS = {"q8_0": 127, "q4_0": 8}  # the largest level: d = amax / 127; d = (value of largest magnitude) / -8
BLOCK = 32  # features a block of a block format
FLOAT16_UNIT = 2.0**-11  # a block's scale is stored in float16: rounded to nearest, relative error at most this
ALONG = ("head", "row")  # a block format's blocks: cut from each head's row, or from a token's whole kv row
SCALES = ("none", "per_tensor", "per_channel", "per_group", "per_block")
UPDATES = ("recomputed", "frozen")
ZERO_POINTS = ("minimum", "level", "extreme")  # affine groups: the grid starts at the group's minimum, holds 0 on a
# level (the range widened), or holds 0 on a level with the extreme of larger magnitude exact (mlx)


def _float_format(name: str) -> type[np.generic]:
    # ml_dtypes is imported only where a format needs it: its 0.7 release takes 2 s to import, which every
    # process of the suite paid (an isolated engine restarted after each crash, the lattice's subprocesses).
    import ml_dtypes

    return np.float16 if name == "float16" else getattr(ml_dtypes, name)  # type: ignore[no-any-return]


def _finfo(name: str) -> Any:
    import ml_dtypes

    return ml_dtypes.finfo(_float_format(name))  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class StorageFormat:
    """A storage format and scale rule, as an adapter declares it (``storage`` mapping)."""

    format: str
    scale: str = "none"
    update: str = "recomputed"
    group: int = 0  # per_group: features a group of each token (a divisor of the head width)
    min_step: float = 0.0  # per_group: the smallest step a group is stored with (0: none)
    zero_point: str = "minimum"  # per_group: "level" (0 exact, range holds 0), "extreme" (0, larger extreme exact)
    along: str = "head"  # per_block, a whole model's cache: blocks cut from each head's row, or from the token's
    # whole kv row (every kv head's, KV * dh features), as an engine lays its cache out

    def __post_init__(self) -> None:
        formats = (*FLOAT_FORMATS, *INTEGER_FORMATS, *AFFINE_FORMATS, *BLOCK_FORMATS)
        if self.format not in formats:
            raise ValueError(f"storage format must be one of {formats}, got {self.format!r}")
        if self.scale not in SCALES:
            raise ValueError(f"storage scale must be one of {SCALES}, got {self.scale!r}")
        if self.update not in UPDATES:
            raise ValueError(f"storage update must be one of {UPDATES}, got {self.update!r}")
        if self.zero_point not in ZERO_POINTS:
            raise ValueError(f"storage zero_point must be one of {ZERO_POINTS}, got {self.zero_point!r}")
        if self.format in INTEGER_FORMATS and self.scale not in ("per_tensor", "per_channel"):
            raise ValueError(f"an integer format ({self.format}) needs a scale: per_tensor or per_channel")
        if (self.format in AFFINE_FORMATS) != (self.scale == "per_group"):
            raise ValueError(f"per_group scales go with the affine formats {tuple(AFFINE_FORMATS)}, and only with "
                             f"them; got {self.format} with {self.scale}")
        if (self.format in BLOCK_FORMATS) != (self.scale == "per_block"):
            raise ValueError(f"per_block scales go with the block formats {tuple(BLOCK_FORMATS)}, and only with "
                             f"them; got {self.format} with {self.scale}")
        if self.along not in ALONG or (self.along != "head" and self.scale != "per_block"):
            raise ValueError(f"storage along must be one of {ALONG}, and row only with per_block, got {self.along!r} "
                             f"with {self.scale}")
        if self.scale == "per_block" and self.update != "recomputed":
            raise ValueError("a per_block scale is each token's own: nothing to freeze")
        if self.scale == "per_group":
            if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 1:
                raise ValueError(f"per_group needs group, the features a group (an int >= 1), got {self.group!r}")
            if isinstance(self.min_step, bool) or not isinstance(self.min_step, (int, float)) or not (
                    0 <= self.min_step < float("inf")):
                raise ValueError(f"min_step must be a finite number >= 0, got {self.min_step!r}")
            if self.update != "recomputed":
                raise ValueError("a per_group scale is each token's own: nothing to freeze")
        elif self.group or self.min_step or self.zero_point != "minimum":
            raise ValueError("group, min_step and zero_point belong to a per_group scale")
        if self.scale == "none" and self.update == "frozen":
            raise ValueError("a frozen update needs a scale to freeze")

    @property
    def largest(self) -> float:
        """The largest value the format stores (before the scale)."""
        if self.format in INTEGER_FORMATS:
            return float(INTEGER_FORMATS[self.format])
        if self.format in AFFINE_FORMATS:
            return float(AFFINE_FORMATS[self.format])
        if self.format in BLOCK_FORMATS:
            return float(BLOCK_FORMATS[self.format])
        return float(_finfo(self.format).max)

    @property
    def unit(self) -> float:
        """One step of the format relative to the magnitude it stores: the float format's epsilon (one ulp
        at 1), or for an integer format one quantization step relative to the scale's amax (1 / qmax); for an
        affine one, relative to the group's range (1 / levels); for a block format, relative to the block's
        amax (1 / 127, 1 / 8)."""
        if self.format in INTEGER_FORMATS:
            return 1.0 / INTEGER_FORMATS[self.format]
        if self.format in BLOCK_FORMATS:
            return 1.0 / BLOCK_FORMATS[self.format]
        if self.format in AFFINE_FORMATS:
            return 1.0 / AFFINE_FORMATS[self.format]
        return float(_finfo(self.format).eps)

    def scale_of(self, rows: np.ndarray) -> np.ndarray:
        """The scale of rows ``[B, KV, T, dh]``, broadcastable against them (amax / largest)."""
        if self.scale == "none":
            return np.ones((1, 1, 1, 1))
        axes = (0, 1, 2, 3) if self.scale == "per_tensor" else (0, 2)
        amax = np.max(np.abs(rows), axis=axes, keepdims=True, initial=0.0)
        scale: np.ndarray = np.where(amax > 0, amax / self.largest, 1.0)
        return scale

    def steps(self, rows: np.ndarray, calibration: np.ndarray | None = None) -> np.ndarray:
        """The quantization step at each element of ``rows``: the scale for an integer format; for a float
        format, the spacing of the format at the element's scaled magnitude, times the scale; for an affine
        one, its group's step."""
        if self.scale == "per_group" and self.zero_point == "extreme":
            grouped, _, signed_step = self._extreme_grid(rows)
            return np.broadcast_to(np.abs(signed_step), grouped.shape).reshape(rows.shape)
        if self.scale == "per_group":
            grouped, _, step = self._groups(rows)
            return np.broadcast_to(step, grouped.shape).reshape(rows.shape)
        if self.scale == "per_block":
            blocks, d = self._blocks(rows)
            return np.broadcast_to(np.abs(d), blocks.shape).reshape(rows.shape)
        scale = self._scale(rows, calibration)
        if self.format in INTEGER_FORMATS:
            steps: np.ndarray = np.broadcast_to(scale, rows.shape).copy()
            return steps
        info = _finfo(self.format)
        magnitude = np.maximum(np.abs(np.clip(rows / scale, -self.largest, self.largest)), float(info.smallest_normal))
        spacing: np.ndarray = float(info.eps) * np.exp2(np.floor(np.log2(magnitude))) * scale
        return spacing

    def error_bounds(self, rows: np.ndarray) -> np.ndarray:
        """The largest error any correct store of ``rows [..., features]`` may have at each element, whatever its
        arithmetic: half a step (``steps``: a level decision made in float32 or float64, either way of a tie), or
        where the format's own rule puts an element further from the grid (a block's or group's far end clipped:
        ``|stored - x|``), the larger; for a block format, plus the float16 rounding of the block's scale, which
        a scale computed in another precision may round the other way (``2^-11 (|x| + d)``)."""
        shaped = rows.reshape(1, 1, 1, -1) if rows.ndim == 1 else rows
        steps = self.steps(shaped)
        bound = np.maximum(steps / 2, np.abs(self.stored(shaped) - shaped))
        if self.scale == "per_block":
            bound = bound + FLOAT16_UNIT * (np.abs(shaped) + steps)
        result: np.ndarray = bound.reshape(rows.shape)
        return result

    def _groups(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rows`` in groups of ``group`` consecutive features of each token, ``[B, KV, T, dh / group, group]``,
        with each group's minimum and step (keeping the last axis, to broadcast against them); with the zero point
        on a level, the range is extended to hold 0 first."""
        if rows.shape[-1] % self.group:
            raise ValueError(f"groups of {self.group} features do not divide a head of {rows.shape[-1]}")
        grouped = rows.reshape(*rows.shape[:-1], -1, self.group)
        low = grouped.min(axis=-1, keepdims=True, initial=np.inf)
        high = grouped.max(axis=-1, keepdims=True, initial=-np.inf)
        if self.zero_point == "level":
            low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
        step = np.maximum((high - low) / self.largest, self.min_step)
        return grouped, low, np.where(step > 0, step, 1.0)

    def _extreme_grid(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``zero_point: extreme``: the groups, each group's extreme of larger magnitude ``e`` (its maximum on a
        tie) and the signed step ``-e / k`` from it (``k = rint(|e| / s)`` steps from ``e`` to 0); where ``k`` is
        0 the step is ``s`` and ``e`` is 0 (the group reads back as 0), unless the group is constant (its one value
        is level 0)."""
        grouped, low, step = self._groups(rows)
        high = grouped.max(axis=-1, keepdims=True, initial=-np.inf)
        extreme = np.where(np.abs(low) > np.abs(high), low, high)
        count = np.rint(np.abs(extreme) / step)
        signed = np.where(count > 0, -extreme / np.maximum(count, 1.0), step)
        return grouped, np.where((count > 0) | (high == low), extreme, 0.0), signed

    def _blocks(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` in blocks of 32 consecutive features, ``[..., dh / 32, 32]``, and each block's scale ``d``
        (unrounded, keeping the last axis): ``amax / 127`` (q8_0), or the value of largest magnitude over -8."""
        if rows.shape[-1] % BLOCK:
            raise ValueError(f"{self.format} stores blocks of {BLOCK} features: a head of {rows.shape[-1]} is not "
                             "a whole number of them")
        blocks = rows.reshape(*rows.shape[:-1], -1, BLOCK)
        if self.format == "q8_0":
            return blocks, np.max(np.abs(blocks), axis=-1, keepdims=True) / self.largest
        first_largest = np.argmax(np.abs(blocks), axis=-1)[..., None]
        return blocks, np.take_along_axis(blocks, first_largest, axis=-1) / -self.largest

    def _scale(self, rows: np.ndarray, calibration: np.ndarray | None) -> np.ndarray:
        if self.update == "frozen" and calibration is None:
            raise ValueError("a frozen scale needs the calibration rows of the first update")
        return self.scale_of(calibration if self.update == "frozen" else rows)  # type: ignore[arg-type]

    def stored(self, rows: np.ndarray, calibration: np.ndarray | None = None) -> np.ndarray:
        """What a cache of this format holds for ``rows [B, KV, T, dh]``, read back as float64.

        ``calibration``: the rows of the first update, for a ``frozen`` scale.
        """
        if self.scale == "per_group" and self.zero_point == "extreme":
            grouped, extreme, signed_step = self._extreme_grid(rows)
            kept = np.clip(np.rint((grouped - extreme) / signed_step), 0, self.largest)
            from_extreme: np.ndarray = extreme + kept * signed_step
            return from_extreme.reshape(rows.shape)
        if self.scale == "per_group" and self.zero_point == "level":
            grouped, low, step = self._groups(rows)
            zero = np.rint(-low / step)  # in [0, levels]: the range holds 0
            levels = np.clip(np.rint(grouped / step) + zero, 0, self.largest)
            on_levels: np.ndarray = (levels - zero) * step
            return on_levels.reshape(rows.shape)
        if self.scale == "per_group":
            grouped, low, step = self._groups(rows)
            stored: np.ndarray = (low + np.clip(np.rint((grouped - low) / step), 0, self.largest) * step)
            return stored.reshape(rows.shape)
        if self.scale == "per_block":
            blocks, d = self._blocks(rows)
            inverse = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
            kept = d.astype(np.float16).astype(np.float64)  # the scale as the block stores it
            if self.format == "q8_0":
                scaled = blocks * inverse
                levels = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)  # roundf: half away from zero
            else:
                levels = np.minimum(15.0, np.floor(blocks * inverse + 8.5)) - 8.0
            block_stored: np.ndarray = levels * kept
            return block_stored.reshape(rows.shape)
        scale = self._scale(rows, calibration)
        scaled = np.clip(rows / scale, -self.largest, self.largest)  # saturate, as casts to fp8 should
        if self.format in INTEGER_FORMATS:
            rounded = np.rint(scaled)
        else:
            rounded = scaled.astype(_float_format(self.format)).astype(np.float64)
        result: np.ndarray = rounded * scale
        return result
