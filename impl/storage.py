"""Quantized or low-precision storage of a cache's rows: a format and a scale rule.

A cache with a ``StorageRule`` keeps its exact rows and stores (and attends
over) their rounded form: float formats round to nearest (``float16``,
``bfloat16``, ``float8_e4m3fn``), integer ones are symmetric
(``int8``, ``int4``: ``rint(x / s)`` clipped to ``±qmax``). The scale is
``amax / largest`` over the whole tensor (``per_tensor``) or per kv head and
feature (``per_channel``), ``recomputed`` from every row held or ``frozen``
at the first update after creation or reset. Values past the range saturate.

Unsigned formats (``uint8``, ``uint4``, ``uint3``, ``uint2``) are affine, one
scale and zero point for each group of ``group`` features of each token
(``per_group``, HQQ's and KIVI's kind): ``q = rint((x - lo) / s)`` with ``lo``
the group's minimum and ``s`` its range over ``2**bits - 1`` (at least
``min_step``), read back ``lo + q * s``. Each token's groups are its own, so
there is nothing to recompute or freeze. With ``zero_point="level"`` the zero
point is an integer level, so that 0 is stored exactly (PyTorch's asymmetric
rule): the group's range is widened to hold 0, ``s`` is that range over
``2**bits - 1``, the zero point ``z = rint(-min / s)``, and a value is stored
``q = clip(rint(x / s) + z, 0, 2**bits - 1)`` and read back ``(q - z) * s``.
With ``zero_point="extreme"`` (mlx's ``mx.quantize``, affine mode) the range
is not widened: the group's value of larger magnitude is the bias, exact, and
the scale is rescaled so that 0 is a whole number of steps from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_FLOATS = ("float16", "bfloat16", "float8_e4m3fn")
_INTEGERS = {"int8": 127, "int4": 7}
_UNSIGNED = {"uint8": 255, "uint4": 15, "uint3": 7, "uint2": 3}


def _float_type(name: str) -> type[np.generic]:
    # ml_dtypes is imported only where a format needs it: its 0.7 release takes 2 s to import, which every
    # process of the suite (an isolated engine restarted after each crash, the lattice's subprocesses) paid.
    import ml_dtypes

    types: dict[str, type[np.generic]] = {
        "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
    return types[name]


@dataclass(frozen=True)
class StorageRule:
    format: str
    scale: str = "none"  # none (float formats only), per_tensor, per_channel; per_group (unsigned formats)
    update: str = "recomputed"  # or frozen
    group: int = 0  # per_group: features a group
    min_step: float = 0.0  # per_group: the smallest step
    zero_point: str = "minimum"  # per_group: "level" (an integer zero point; 0 stored exactly), or "extreme"

    def __post_init__(self) -> None:
        if self.format not in _FLOATS and self.format not in _INTEGERS and self.format not in _UNSIGNED:
            raise ValueError(f"unknown storage format {self.format!r}")
        if self.scale not in ("none", "per_tensor", "per_channel", "per_group") or self.update not in (
                "recomputed", "frozen"):
            raise ValueError(f"unknown scale rule {self.scale!r} / {self.update!r}")
        if self.scale == "none" and (self.format in _INTEGERS or self.update == "frozen"):
            raise ValueError(f"{self.format} with a {self.update} scale needs a scale rule")
        if (self.format in _UNSIGNED) != (self.scale == "per_group") or (
                self.scale == "per_group" and (self.group < 1 or self.update != "recomputed")):
            raise ValueError(f"{self.format} with {self.scale} (group {self.group}, {self.update}): unsigned "
                             "formats take per_group scales, a group of 1 or more, recomputed")
        if self.zero_point not in ("minimum", "level", "extreme") or (
                self.zero_point != "minimum" and self.scale != "per_group"):
            raise ValueError(f"zero point {self.zero_point!r} with {self.scale}: minimum, level or extreme, per_group "
                             "only")

    def declared(self) -> dict[str, object]:
        if self.scale == "per_group":
            return {"format": self.format, "scale": self.scale, "group": self.group,
                    **({"min_step": self.min_step} if self.min_step else {}),
                    **({"zero_point": self.zero_point} if self.zero_point != "minimum" else {})}
        return {"format": self.format, "scale": self.scale, "update": self.update}

    @property
    def largest(self) -> float:
        if self.format in _INTEGERS:
            return float(_INTEGERS[self.format])
        import ml_dtypes  # (see _float_type)

        return float(ml_dtypes.finfo(_float_type(self.format)).max)  # type: ignore[no-untyped-call]

    def scale_for(self, rows: np.ndarray) -> np.ndarray:
        """``amax / largest`` of rows ``[B, KV, T, dh]``, shaped to broadcast (1 where all are zero); for
        per_group, 1 (each token's groups have their own, computed as it is rounded)."""
        if self.scale in ("none", "per_group"):
            return np.ones((1, 1, 1, 1))
        amax = np.abs(rows).max(axis=(0, 1, 2, 3) if self.scale == "per_tensor" else (0, 2), keepdims=True,
                                initial=0.0)
        return np.where(amax > 0, amax / self.largest, 1.0)

    def round(self, rows: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """What is stored of ``rows`` at ``scale``, read back as float64."""
        if self.scale == "per_group" and self.zero_point == "level":
            return self._round_groups_to_levels(rows)
        if self.scale == "per_group" and self.zero_point == "extreme":
            return self._round_groups_from_extreme(rows)
        if self.scale == "per_group":
            return self._round_groups(rows)
        scaled = np.clip(rows / scale, -self.largest, self.largest)
        if self.format in _INTEGERS:
            return np.rint(scaled) * scale  # type: ignore[no-any-return]
        return scaled.astype(_float_type(self.format)).astype(np.float64) * scale  # type: ignore[no-any-return]

    def _round_groups(self, rows: np.ndarray) -> np.ndarray:
        """Affine rounding, each group of ``group`` consecutive features of each token on its own."""
        levels = _UNSIGNED[self.format]
        grouped = rows.reshape(*rows.shape[:-1], rows.shape[-1] // self.group, self.group)
        low = grouped.min(axis=-1, keepdims=True, initial=np.inf)
        step = np.maximum((grouped.max(axis=-1, keepdims=True, initial=-np.inf) - low) / levels, self.min_step)
        step = np.where(step > 0, step, 1.0)
        stored: np.ndarray = (low + np.clip(np.rint((grouped - low) / step), 0, levels) * step).reshape(rows.shape)
        return stored

    def _round_groups_to_levels(self, rows: np.ndarray) -> np.ndarray:
        """Affine rounding with an integer zero point: each group's range widened to hold 0, so that 0 is a level."""
        levels = _UNSIGNED[self.format]
        # [B, KV, T, groups, group], by the count of groups: -1 cannot be inferred when no rows are held
        grouped = np.reshape(rows, (*rows.shape[:-1], rows.shape[-1] // self.group, self.group))
        low = np.minimum(grouped.min(axis=-1, keepdims=True, initial=np.inf), 0.0)
        high = np.maximum(grouped.max(axis=-1, keepdims=True, initial=-np.inf), 0.0)
        step = np.maximum((high - low) / levels, self.min_step)
        step = np.where(step > 0, step, 1.0)
        zero = np.clip(np.rint(-low / step), 0, levels)
        quantized = np.clip(np.rint(grouped / step) + zero, 0, levels).astype(np.uint8)
        stored: np.ndarray = np.reshape((quantized - zero) * step, rows.shape)
        return stored

    def _round_groups_from_extreme(self, rows: np.ndarray) -> np.ndarray:
        """Affine rounding as mlx's quantizer: the bias the group's value of larger magnitude (the maximum on a
        tie), the scale rescaled so that 0 is a whole number of steps from it; a constant group is its bias."""
        levels = _UNSIGNED[self.format]
        grouped = np.reshape(rows, (*rows.shape[:-1], rows.shape[-1] // self.group, self.group))
        w_min = grouped.min(axis=-1, keepdims=True, initial=np.inf)
        w_max = grouped.max(axis=-1, keepdims=True, initial=-np.inf)
        from_min = np.abs(w_min) > np.abs(w_max)
        scale = np.maximum((w_max - w_min) / levels, self.min_step)
        scale = np.where(scale > 0, scale, 1.0)
        scale = np.where(from_min, scale, -scale)  # counted from the maximum, the steps go down
        edge = np.where(from_min, w_min, w_max)
        q0 = np.rint(edge / scale)
        constant = w_max == w_min
        bias = np.where((q0 != 0) | constant, edge, 0.0)
        scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1.0), scale)
        quantized = np.clip(np.rint((grouped - bias) / scale), 0, levels)
        stored: np.ndarray = np.reshape(scale * quantized + bias, rows.shape)
        return stored


BLOCK_FORMATS = ("q8_0", "q4_0")  # llama.cpp's: a float16 scale per 32 consecutive features of a row


def stored_in_blocks(rows: np.ndarray, block_format: str) -> np.ndarray:
    """What a ``q8_0`` or ``q4_0`` cache reads back of ``rows [..., dh]`` (dh a multiple of 32), quantized in
    float32 as llama.cpp's ``quantize_row_q8_0_ref`` / ``quantize_row_q4_0_ref`` do: the scale rounded to
    float16 when stored, the levels found with the unrounded one."""
    if block_format not in BLOCK_FORMATS:
        raise ValueError(f"block format must be one of {BLOCK_FORMATS}, got {block_format!r}")
    if rows.shape[-1] % 32:
        raise ValueError(f"{block_format} needs rows of whole blocks of 32, got {rows.shape[-1]} features")
    x = rows.astype(np.float32).reshape(*rows.shape[:-1], rows.shape[-1] // 32, 32)
    if block_format == "q8_0":
        d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    else:  # the value of largest magnitude (the first of a tie) maps to level -8
        d = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1) / np.float32(-8)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    if block_format == "q8_0":
        levels = np.clip(np.trunc(x * inverse + np.copysign(np.float32(0.5), x)), -127, 127)  # roundf, an int8
    else:
        levels = np.minimum(np.float32(15), np.floor(x * inverse + np.float32(8.5))) - np.float32(8)
    read_back: np.ndarray = np.reshape(levels * d.astype(np.float16).astype(np.float32), rows.shape)
    return read_back.astype(rows.dtype)
