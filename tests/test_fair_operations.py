"""Fair verdicts on the cache operations of docs/spec.md §13: each design choice the spec leaves open passes
when declared, and the same behaviour undeclared (or a wrong one) fails -- so the property is not vacuous.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from impl.cache import LayerKvCache
from impl.conformance import ReferenceAdapter
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import RunResult, run_machine

pytestmark = pytest.mark.slow  # whole machine runs: tox runs these once, on Python 3.11

REFERENCE = ReferenceAdapter.capabilities


def _run(adapter: Any, windowed: bool = False, examples: int = 60) -> RunResult:
    return run_machine("cache_operations", adapter, property_id=f"fair-{adapter.name}-{windowed}",
                       settings=profiles.settings_for("ci", database=None, max_examples=examples,
                                                      report_multiple_bugs=False),
                       parameters={"style": "half_split", "grouped": None, "windowed": windowed})


class ClampingTruncate(ReferenceAdapter):
    """Clamps an out-of-range n into [0, length] instead of rejecting it, and claims no length validation."""

    name = "test-clamping-truncate"
    capabilities = REFERENCE - {"validates_length"}

    def truncate(self, cache: LayerKvCache, n: Any) -> None:
        if isinstance(n, (int, np.integer)) and not isinstance(n, bool):
            n = min(max(int(n), 0), cache.length)
        cache.truncate(n)


class ClampingTruncateClaimingValidation(ClampingTruncate):
    name = "test-clamping-truncate-claims-validation"
    capabilities = REFERENCE


class WrappingReorder(ReferenceAdapter):
    """Lets numpy wrap a negative index (as torch's index_select would not), and claims no index validation."""

    name = "test-wrapping-reorder"
    capabilities = REFERENCE - {"validates_indices"}

    def reorder(self, cache: LayerKvCache, indices: Any) -> None:
        array = np.asarray(indices)
        if array.dtype.kind in "iu" and array.shape == (cache.batch_size,):
            indices = array % cache.batch_size
        cache.reorder(indices)


class WrappingReorderClaimingValidation(WrappingReorder):
    name = "test-wrapping-reorder-claims-validation"
    capabilities = REFERENCE


class LazyFork:
    """A copy-on-write fork: shares the original's cache until either side writes."""

    def __init__(self, cache: LayerKvCache) -> None:
        self.cache, self.owned = cache, False


class CopyOnWriteForks(ReferenceAdapter):
    """Forks share storage until a write (allowed: snapshots are what is judged, not where bytes live). Its
    first write after a fork moves to new buffers, so it claims nothing about buffers (physical_storage)."""

    name = "test-copy-on-write-forks"
    capabilities = REFERENCE - {"physical_storage", "reset_keeps_bytes", "batch_select", "batch_repeat"}

    def create_cache(self, layer: Any, batch_size: int, capacity: int, window: int | None = None,
                     sinks: int = 0) -> LazyFork:
        handle = LazyFork(super().create_cache(layer, batch_size, capacity, window, sinks))
        handle.owned = True
        return handle

    def fork(self, handle: LazyFork) -> LazyFork:
        handle.owned = False  # from now on both share one cache: whoever writes first copies
        return LazyFork(handle.cache)

    def _own(self, handle: LazyFork) -> LayerKvCache:
        if not handle.owned:
            handle.cache, handle.owned = handle.cache.fork(), True
        return handle.cache

    def step(self, layer: Any, handle: LazyFork, x: np.ndarray) -> np.ndarray:
        return super().step(layer, self._own(handle), x)

    def append(self, layer: Any, handle: LazyFork, x: np.ndarray) -> np.ndarray:
        return super().append(layer, self._own(handle), x)

    def truncate(self, handle: LazyFork, n: Any) -> None:
        super().truncate(self._own(handle), n)

    def reorder(self, handle: LazyFork, indices: Any) -> None:
        super().reorder(self._own(handle), indices)

    def reset(self, handle: LazyFork) -> None:
        super().reset(self._own(handle))

    def snapshot(self, handle: LazyFork) -> Any:
        return super().snapshot(handle.cache)


class EagerForkSharingTheCache(CopyOnWriteForks):
    """Forgets to copy on write: the fork and the original stay one cache."""

    name = "test-fork-sharing-the-cache"

    def _own(self, handle: LazyFork) -> LayerKvCache:
        return handle.cache


class SilentWindowTruncate(ReferenceAdapter):
    """Truncates a window cache past its oldest held row without complaint (transformers' static window
    layer): the rows the next query needs are gone."""

    name = "test-silent-window-truncate"

    def truncate(self, cache: LayerKvCache, n: Any) -> None:
        if cache.window is not None and type(n) is int and 0 <= n <= cache.length:
            keys, values, positions = cache.held_rows()
            kept = positions < n  # what the ring still holds of the first n rows, at the new end
            cache.load_rows(keys[:, :, kept].copy(), values[:, :, kept].copy(), positions[kept].copy(), n)
            return
        cache.truncate(n)


@pytest.mark.parametrize("adapter, windowed", [
    (ClampingTruncate(), False), (WrappingReorder(), False), (CopyOnWriteForks(), False), (CopyOnWriteForks(), True)],
    ids=lambda a: getattr(a, "name", str(a)))
def test_a_declared_design_choice_conforms(adapter: Any, windowed: bool) -> None:
    result = _run(adapter, windowed)
    assert result.failure is None, result.failure


@pytest.mark.parametrize("adapter, windowed, complaint", [
    (ClampingTruncateClaimingValidation(), False, "should be rejected with invalid_length"),
    (WrappingReorderClaimingValidation(), False, "should be rejected with invalid_indices"),
    (EagerForkSharingTheCache(), False, "must not change while another is operated on"),
    (SilentWindowTruncate(), True, "rows were appended|the next row attends to")],
    ids=lambda a: getattr(a, "name", str(a)))
def test_the_same_choice_undeclared_or_broken_fails(adapter: Any, windowed: bool, complaint: str) -> None:
    result = _run(adapter, windowed, examples=100)
    assert isinstance(result.failure, NonConformance), result.failure
    assert re.search(complaint, str(result.failure)), result.failure
