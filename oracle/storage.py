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
  first update after creation or reset (its calibration rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

FLOAT_FORMATS = ("float16", "bfloat16", "float8_e4m3fn")
INTEGER_FORMATS = {"int8": 127, "int4": 7}
SCALES = ("none", "per_tensor", "per_channel")
UPDATES = ("recomputed", "frozen")


def _float_format(name: str) -> type[np.generic]:
    return np.float16 if name == "float16" else getattr(ml_dtypes, name)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class StorageFormat:
    """A storage format and scale rule, as an adapter declares it (``storage`` mapping)."""

    format: str
    scale: str = "none"
    update: str = "recomputed"

    def __post_init__(self) -> None:
        if self.format not in FLOAT_FORMATS and self.format not in INTEGER_FORMATS:
            raise ValueError(f"storage format must be one of {(*FLOAT_FORMATS, *INTEGER_FORMATS)}, got {self.format!r}")
        if self.scale not in SCALES:
            raise ValueError(f"storage scale must be one of {SCALES}, got {self.scale!r}")
        if self.update not in UPDATES:
            raise ValueError(f"storage update must be one of {UPDATES}, got {self.update!r}")
        if self.format in INTEGER_FORMATS and self.scale == "none":
            raise ValueError(f"an integer format ({self.format}) needs a scale: per_tensor or per_channel")
        if self.scale == "none" and self.update == "frozen":
            raise ValueError("a frozen update needs a scale to freeze")

    @property
    def largest(self) -> float:
        """The largest value the format stores (before the scale)."""
        if self.format in INTEGER_FORMATS:
            return float(INTEGER_FORMATS[self.format])
        return float(ml_dtypes.finfo(_float_format(self.format)).max)  # type: ignore[no-untyped-call]

    @property
    def unit(self) -> float:
        """One step of the format relative to the magnitude it stores: the float format's epsilon (one ulp
        at 1), or for an integer format one quantization step relative to the scale's amax (1 / qmax)."""
        if self.format in INTEGER_FORMATS:
            return 1.0 / INTEGER_FORMATS[self.format]
        return float(ml_dtypes.finfo(_float_format(self.format)).eps)  # type: ignore[no-untyped-call]

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
        format, the spacing of the format at the element's scaled magnitude, times the scale."""
        scale = self._scale(rows, calibration)
        if self.format in INTEGER_FORMATS:
            steps: np.ndarray = np.broadcast_to(scale, rows.shape).copy()
            return steps
        info = ml_dtypes.finfo(_float_format(self.format))  # type: ignore[no-untyped-call]
        magnitude = np.maximum(np.abs(np.clip(rows / scale, -self.largest, self.largest)), float(info.smallest_normal))
        spacing: np.ndarray = float(info.eps) * np.exp2(np.floor(np.log2(magnitude))) * scale
        return spacing

    def _scale(self, rows: np.ndarray, calibration: np.ndarray | None) -> np.ndarray:
        if self.update == "frozen" and calibration is None:
            raise ValueError("a frozen scale needs the calibration rows of the first update")
        return self.scale_of(calibration if self.update == "frozen" else rows)  # type: ignore[arg-type]

    def stored(self, rows: np.ndarray, calibration: np.ndarray | None = None) -> np.ndarray:
        """What a cache of this format holds for ``rows [B, KV, T, dh]``, read back as float64.

        ``calibration``: the rows of the first update, for a ``frozen`` scale.
        """
        scale = self._scale(rows, calibration)
        scaled = np.clip(rows / scale, -self.largest, self.largest)  # saturate, as casts to fp8 should
        if self.format in INTEGER_FORMATS:
            rounded = np.rint(scaled)
        else:
            rounded = scaled.astype(_float_format(self.format)).astype(np.float64)
        result: np.ndarray = rounded * scale
        return result
