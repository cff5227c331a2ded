"""Fair verdicts on layer caches: a cache is judged by what the spec requires and what it declares.

Each adapter here is the reference with one design choice changed and declared; each must pass. The
same choice left undeclared must fail (the property is not vacuous).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from examples.minimal_adapter import MinimalAdapter, rotate
from impl.cache import LayerKvCache
from impl.conformance import ReferenceAdapter
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import RunResult, run_machine

# Whole machine runs and subprocess runs of the suite: tox runs these once, on Python 3.11 (tox.ini).
pytestmark = pytest.mark.slow

REFERENCE = ReferenceAdapter.capabilities


def _run(adapter: Any, style: str = "interleaved", grouped: bool = False, examples: int = 40) -> RunResult:
    return run_machine("layer_cache", adapter, property_id=f"fair-{adapter.name}", settings=profiles.settings_for(
        "ci", database=None, max_examples=examples, report_multiple_bugs=False),
        parameters={"style": style, "grouped": grouped})


class ZeroingReset(ReferenceAdapter):
    """Zeroes both buffers on reset, as transformers' StaticCache does, and says so."""

    name = "test-zeroing-reset"
    capabilities = (REFERENCE - {"reset_keeps_bytes"}) | {"reset_keeps_buffers", "reset_zeroes"}

    def reset(self, cache: LayerKvCache) -> None:
        cache.reset(zero_storage=True)


class ZeroingResetClaimingBytes(ZeroingReset):
    name = "test-zeroing-reset-claims-bytes"
    capabilities = REFERENCE


class TiedGeometry(ReferenceAdapter):
    """Rejects layers whose model width is not heads x head width (most model code does)."""

    name = "test-tied-geometry"
    layer_limits: ClassVar[dict[str, Any]] = {"model_width_is_heads_times_head_width": True, "max_heads": 2}

    def create_layer(self, weights: Any, rope: Any) -> Any:
        if weights.model_width != weights.heads * weights.head_width or weights.heads > 2:
            raise ValueError(f"model width {weights.model_width} != {weights.heads} heads x {weights.head_width}")
        return super().create_layer(weights, rope)


class TiedGeometryUndeclared(TiedGeometry):
    name = "test-tied-geometry-undeclared"
    layer_limits: ClassVar[dict[str, Any]] = {}


class NoValidation(ReferenceAdapter):
    """Validates nothing it declares: its typed errors are not judged, only that raising changed nothing."""

    name = "test-no-validation"
    capabilities = REFERENCE - {"input_validation", "non_finite_rejection", "binding_checks", "fixed_capacity"}

    def error_kind(self, error: BaseException) -> str | None:
        return None  # maps nothing: an unmapped exception is fine where no kind is claimed


@pytest.mark.parametrize("adapter", [ZeroingReset(), TiedGeometry(), NoValidation()], ids=lambda a: a.name)
def test_a_declared_design_choice_conforms(adapter: Any) -> None:
    result = _run(adapter)
    assert result.failure is None, result.failure


@pytest.mark.parametrize("adapter, complaint", [
    (ZeroingResetClaimingBytes(), "reset must keep both buffers and every byte"),
    (TiedGeometryUndeclared(), "create the layer: raised ValueError"),
], ids=["reset-claims-bytes", "geometry-undeclared"])
def test_the_same_choice_undeclared_fails(adapter: Any, complaint: str) -> None:
    result = _run(adapter)
    assert isinstance(result.failure, NonConformance) and complaint in str(result.failure), result.failure


def test_the_tied_geometry_is_what_is_drawn() -> None:
    from hypothesis import given, settings

    from kvcache_conformance import generate as s
    from kvcache_conformance.protocol import LayerLimits, declared

    limits = LayerLimits.of(TiedGeometry())

    @settings(max_examples=200, database=None)
    @given(config=s.layer_configs(declared(REFERENCE), limits=limits))
    def check(config: s.LayerConfig) -> None:
        w = config.weights
        assert w.model_width == w.heads * w.head_width and w.heads <= 2

    check()
    with pytest.raises(TypeError, match="unknown limit"):
        LayerLimits.of(type("Odd", (), {"layer_limits": {"max_head": 2}})())


class UnrotatedKeys(MinimalAdapter):
    """The minimal example's cache, but keeping keys as ``x @ Wk`` and rotating them when read (as caches that
    re-rotate keys do): its snapshot shows unrotated keys, and it says so."""

    name = "test-unrotated-keys"
    capabilities = frozenset({"float64", "rope_interleaved", "keys_unrotated"})

    def step(self, layer: Any, cache: Any, x: Any) -> Any:
        w, heads, dh = layer.weights, layer.heads, layer.head_width
        row = x[:, 0, :]
        split = lambda y: y.reshape(row.shape[0], heads, dh)  # noqa: E731  [B, H, dh]
        key, value = split(row @ w["wk"]), split(row @ w["wv"])
        keys = np.stack([rotate(k, p, layer.rope) for p, k in enumerate([*cache.keys, key])], axis=2)  # on read
        values = np.stack([*cache.values, value], axis=2)
        query = rotate(split(row @ w["wq"]), len(cache.keys), layer.rope)
        scores = np.einsum("bhd,bhtd->bht", query, keys) / np.sqrt(dh)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        output = np.einsum("bht,bhtd->bhd", weights, values).reshape(row.shape[0], heads * dh) @ w["wo"]
        cache.keys.append(key)  # unrotated, and only once nothing above can fail
        cache.values.append(value)
        return output[:, None, :]


class UnrotatedKeysUndeclared(UnrotatedKeys):
    name = "test-unrotated-keys-undeclared"
    capabilities = frozenset({"float64", "rope_interleaved"})


def test_keys_cached_unrotated_conform_when_declared() -> None:
    result = _run(UnrotatedKeys())
    assert result.failure is None, result.failure
    undeclared = _run(UnrotatedKeysUndeclared())
    # judged as rotated keys: the cached keys differ, or (met first under some seeds) the rows held are found
    # changed by an accepted unclaimed call -- both compare the unrotated rows with the oracle's rotated ones
    failure = undeclared.failure
    assert isinstance(failure, NonConformance), failure
    assert failure.check == "cached keys" or failure.kind == "an accepted call changed a row held before it", (
        failure.kind, failure.check)
