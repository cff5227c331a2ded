"""The model side of the layer-cache machines: what a live cache must hold, and the oracle's view of it.

The model of a cache is the list of rows fed since it was created or last
reset, each ``[B, D]`` at positions 0, 1, ..., with the weights they were
computed with (docs/spec.md §4.4, §13). An operation's meaning is what it
does to that list: a step or chunk extends it, truncation cuts it, a reorder
gathers every row's batch entries, a fork copies it. ``LayerOracle``
recomputes everything a cache must show from the list, under the declared
tolerance and storage rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..generate.layers import LayerConfig
from ..generate.layouts import layout_of, with_layout
from ..judge.tolerance import Judge, Reference
from ..oracle import (
    FLOAT64,
    AttentionTrace,
    AttentionWeights,
    NumberSystem,
    RopeConfig,
    full_prefix_attention,
    rope_rotate,
)
from ..protocol.kinds import ErrorKind


@dataclass
class CacheModel:
    """What one live cache must hold."""

    weights: AttentionWeights  # what every row of this cache was computed with
    batch_size: int
    rows: list[np.ndarray] = field(default_factory=list)  # [B, D] each, since creation or reset
    stale: bool = False  # its layer's parameters were written in place since it was built
    peaked: bool = False  # it holds a peaked row: valid appends would leave the documented range
    calibration: list[np.ndarray] | None = None  # the first update's rows since creation or reset (a frozen scale)
    trace: Reference[AttentionTrace] | None = None  # the oracle of ``rows``, computed on demand

    def copy(self) -> CacheModel:
        return replace(self, rows=list(self.rows))

    def cut(self, length: int) -> None:
        self.rows, self.trace = self.rows[:length], None
        self.peaked = self.peaked and length > 0

    def gather(self, indices: np.ndarray) -> None:
        """Every held row's batch entries gathered by ``indices`` (a reorder, a select, a repeat). A frozen
        scale stays as it was calibrated: the calibration rows are kept."""
        self.rows, self.trace = [row[indices] for row in self.rows], None
        self.batch_size = len(indices)

    def emptied(self) -> None:
        """A reset: nothing held; the binding, and so staleness, kept."""
        self.rows, self.trace, self.peaked, self.calibration = [], None, False, None


class LayerOracle:
    """Everything a cache of one layer configuration must show, recomputed from its model."""

    def __init__(self, config: LayerConfig, window: int | None, judge: Judge, keys_unrotated: bool,
                 sinks: int = 0) -> None:
        self.config, self.window, self.judge, self.keys_unrotated = config, window, judge, keys_unrotated
        self.sinks = sinks  # attention sinks beside the window (docs/spec.md §13.5)

    def first_failing_check(self, model: CacheModel, capacity: int, *, tokens: int = 1, layer: str = "own",
                            non_finite: bool = False) -> ErrorKind | None:
        """The specification's verdict on appending ``tokens`` well-formed rows (docs/spec.md §4.5, §13.1): the
        first failing check in the documented order, or None. ``layer``: "own", "recreated" or "rope variant"."""
        if layer == "recreated":
            return ErrorKind.LAYER_MISMATCH
        if model.stale:
            return ErrorKind.REVISION_MISMATCH
        if layer == "rope variant":
            return ErrorKind.ROPE_MISMATCH
        if len(model.rows) + tokens > capacity:
            return ErrorKind.FULL
        return ErrorKind.NON_FINITE if non_finite else None

    def reference(self, model: CacheModel, rows: list[np.ndarray] | None = None,
                  rope: RopeConfig | None = None) -> Reference[AttentionTrace]:
        """The oracle of ``rows`` (the model's by default), and the naive computation the tolerance needs."""
        x = np.stack(model.rows if rows is None else rows, axis=1)  # [B, T, D]
        rope = rope or self.config.oracle_rope

        def compute(numbers: NumberSystem, storage: Any = None) -> AttentionTrace:
            return full_prefix_attention(x, model.weights, rope, window=self.window, sinks=self.sinks, numbers=numbers,
                                         storage=storage)

        return self.judge.reference(compute, lambda numbers: compute(numbers, self._stored(model, rope)))

    def held(self, model: CacheModel) -> Reference[AttentionTrace] | None:
        """The oracle of what the cache holds (None: nothing), remembered on the model."""
        if model.rows and model.trace is None:
            model.trace = self.reference(model)
        return model.trace

    def held_keys(self, model: CacheModel) -> Reference[AttentionTrace] | None:
        """What the cache must hold as keys: rotated, or with ``keys_unrotated`` the keys before RoPE."""
        if not model.rows or not self.keys_unrotated or self.config.rope is None:
            return self.held(model)
        return self.reference(model, rope=self.unrotated)

    @property
    def unrotated(self) -> RopeConfig:
        """RoPE that rotates nothing: the oracle of keys cached before RoPE."""
        rope = self.config.rope
        assert rope is not None
        return RopeConfig(rope.style, rope.base, 0, rope.max_positions)

    # -- declared storage (docs/spec.md §13.6) ----------------------------------------------------------------

    def _stored(self, model: CacheModel, rope: RopeConfig) -> Any:
        """What the declared storage keeps of held keys and values (a frozen scale: of the calibration rows)."""
        storage, calibration = self.judge.storage, self._calibration(model, rope)
        assert storage is not None
        return lambda keys, values: (storage.stored(keys, None if calibration is None else calibration[0]),
                                     storage.stored(values, None if calibration is None else calibration[1]))

    def _calibration(self, model: CacheModel, rope: RopeConfig) -> tuple[np.ndarray, np.ndarray] | None:
        """The exact keys and values of the first update, which a frozen scale is calibrated on."""
        if self.judge.storage is None or self.judge.storage.update != "frozen":
            return None
        assert model.calibration is not None, "a frozen scale is calibrated on the first update"
        first = full_prefix_attention(np.stack(model.calibration, axis=1), model.weights, rope, window=self.window,
                                      sinks=self.sinks)
        return first.keys, first.values

    def steps(self, model: CacheModel, reference: Reference[AttentionTrace] | None, name: str,
              rope: RopeConfig | None = None) -> np.ndarray | None:
        """The declared storage's quantization step at each element of the held ``keys`` or ``values``."""
        if self.judge.storage is None or reference is None:
            return None
        calibration = self._calibration(model, rope or self.config.oracle_rope)
        rows = getattr(reference.truth, name)
        return self.judge.storage.steps(rows, None if calibration is None else calibration[name == "values"])

    def stored_score_overflows(self, model: CacheModel, head: int, row: np.ndarray) -> bool:
        """Whether head ``head``'s score of ``row`` with its own key overflows when the key is what a frozen scale
        stores of it (saturated past the range) -- the key a quantized cache attends over; the query is computed,
        not stored."""
        weights, rope, storage = model.weights, self.config.oracle_rope, self.judge.storage
        position, dh = len(model.rows), weights.head_width
        if position >= rope.max_positions:  # the append is due the RoPE range check first: no overflow to offer
            return False
        calibration = self._calibration(model, rope)
        assert storage is not None and calibration is not None
        x = np.zeros((1, position + 1, row.shape[-1]))
        x[0, -1] = row
        key = storage.stored(full_prefix_attention(x, weights, rope).keys[:, :, -1:], calibration[0])
        with np.errstate(over="ignore", invalid="ignore"):
            query = rope_rotate(list(row @ weights.wq[:, head * dh:(head + 1) * dh]), position, rope, FLOAT64)
            score = float(np.dot(query, key[0, head // weights.group_size, 0]) / np.sqrt(dh))
        return not np.isfinite(score)

    def within_frozen_scale(self, model: CacheModel, x: np.ndarray) -> np.ndarray:
        """A declared frozen scale is a limit: valid rows after the first update are drawn within its range
        (scaled down, keeping their layout, until no stored key or value saturates)."""
        storage = self.judge.storage
        if storage is None or storage.update != "frozen" or model.calibration is None:  # (kept after truncate(0))
            return x
        rope = self.config.oracle_rope
        new = full_prefix_attention(np.stack([*model.rows, *np.moveaxis(x, 1, 0)], axis=1), model.weights, rope,
                                    window=self.window, sinks=self.sinks)
        first = full_prefix_attention(np.stack(model.calibration, axis=1), model.weights, rope, window=self.window,
                                      sinks=self.sinks)
        ratio = 0.0
        for name in ("keys", "values"):
            limit = storage.scale_of(getattr(first, name)) * storage.largest
            ratio = max(ratio, float(np.max(np.abs(getattr(new, name)[:, :, -x.shape[1]:]) / limit)))
        if ratio <= 0.99:
            return x
        return with_layout(np.ascontiguousarray(x) * (0.99 / ratio), *layout_of(x))
