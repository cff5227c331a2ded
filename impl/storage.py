"""Quantized or low-precision storage of a cache's rows: a format and a scale rule.

A cache with a ``StorageRule`` keeps its exact rows and stores (and attends
over) their rounded form: float formats round to nearest (``float16``,
``bfloat16``, ``float8_e4m3fn``), integer ones are symmetric
(``int8``, ``int4``: ``rint(x / s)`` clipped to ``±qmax``). The scale is
``amax / largest`` over the whole tensor (``per_tensor``) or per kv head and
feature (``per_channel``), ``recomputed`` from every row held or ``frozen``
at the first update after creation or reset. Values past the range saturate.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

_FLOATS: dict[str, type[np.generic]] = {
    "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
_INTEGERS = {"int8": 127, "int4": 7}


@dataclass(frozen=True)
class StorageRule:
    format: str
    scale: str = "none"  # none (float formats only), per_tensor, per_channel
    update: str = "recomputed"  # or frozen

    def __post_init__(self) -> None:
        if self.format not in _FLOATS and self.format not in _INTEGERS:
            raise ValueError(f"unknown storage format {self.format!r}")
        if self.scale not in ("none", "per_tensor", "per_channel") or self.update not in ("recomputed", "frozen"):
            raise ValueError(f"unknown scale rule {self.scale!r} / {self.update!r}")
        if self.scale == "none" and (self.format in _INTEGERS or self.update == "frozen"):
            raise ValueError(f"{self.format} with a {self.update} scale needs a scale rule")

    def declared(self) -> dict[str, str]:
        return {"format": self.format, "scale": self.scale, "update": self.update}

    @property
    def largest(self) -> float:
        if self.format in _INTEGERS:
            return float(_INTEGERS[self.format])
        return float(ml_dtypes.finfo(_FLOATS[self.format]).max)  # type: ignore[no-untyped-call]

    def scale_for(self, rows: np.ndarray) -> np.ndarray:
        """``amax / largest`` of rows ``[B, KV, T, dh]``, shaped to broadcast (1 where all are zero)."""
        if self.scale == "none":
            return np.ones((1, 1, 1, 1))
        amax = np.abs(rows).max(axis=(0, 1, 2, 3) if self.scale == "per_tensor" else (0, 2), keepdims=True,
                                initial=0.0)
        return np.where(amax > 0, amax / self.largest, 1.0)

    def round(self, rows: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """What is stored of ``rows`` at ``scale``, read back as float64."""
        scaled = np.clip(rows / scale, -self.largest, self.largest)
        if self.format in _INTEGERS:
            return np.rint(scaled) * scale  # type: ignore[no-any-return]
        return scaled.astype(_FLOATS[self.format]).astype(np.float64) * scale  # type: ignore[no-any-return]
