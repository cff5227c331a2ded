"""``layer_limits["max_shapes"]``: layers and caches drawn from a few shapes all run long (docs/spec.md §7), for
adapters that compile per shape; a JIT-like cache that refuses more passes the layer machine with the declaration."""

from __future__ import annotations

from hypothesis import find, given, settings
from hypothesis import strategies as st

from kvcache_conformance.generate.layers import LayerConfig, few_shapes, layer_configs, layer_families
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.protocol.declarations import LayerLimits
from kvcache_conformance.protocol.kinds import declared
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine
from tests.lattice import REFERENCE, CompilesPerShape, Declared

CAPABILITIES = frozenset(declared(REFERENCE))


def shape_of(config: LayerConfig) -> tuple[int, ...]:
    w = config.weights
    return (w.model_width, w.heads, w.kv_heads, w.head_width, config.batch_size, config.capacity,
            *((config.rope.rotary_width, config.rope.max_positions) if config.rope else ()))


FEW = LayerLimits(max_shapes=3)
FAMILIES = tuple(layer_families(CAPABILITIES, FEW))


def allowed(limits: LayerLimits) -> set[tuple[int, ...]]:
    return {(s.model_width, s.heads, s.kv_heads, s.head_width, s.batch_size, s.capacity, s.rotary_width,
             s.max_positions) for grouped in (False, True) for s in few_shapes(CAPABILITIES, limits, grouped)}


@settings(max_examples=60, deadline=None, database=None)
@given(config=layer_configs(CAPABILITIES, limits=FEW, families=FAMILIES))
def test_every_layer_drawn_has_one_of_the_few_shapes(config: LayerConfig) -> None:
    shape = shape_of(config)
    assert shape[:6] in {a[:6] for a in allowed(FEW)}
    if config.rope is not None:
        assert shape in allowed(FEW)  # its rotary width and RoPE table length too


def test_draws_reach_each_of_the_few_shapes_and_only_the_declaration_keeps_them_few() -> None:
    shapes = allowed(FEW)
    assert 4 <= len(shapes) <= 6  # three of each attention kind
    quick = settings(max_examples=2000, database=None, deadline=None)
    for wanted in shapes:
        found = find(layer_configs(CAPABILITIES, limits=FEW, families=FAMILIES),
                     lambda c, wanted=wanted: shape_of(c)[:6] == wanted[:6], settings=quick)
        assert shape_of(found)[:6] == wanted[:6]
    other = find(layer_configs(CAPABILITIES, families=FAMILIES),
                 lambda c: shape_of(c)[:6] not in {a[:6] for a in shapes}, settings=quick)
    assert shape_of(other)[:6] not in {a[:6] for a in shapes}
    values = find(st.tuples(*[layer_configs(CAPABILITIES, limits=FEW, families=FAMILIES)] * 2),
                  lambda pair: shape_of(pair[0]) == shape_of(pair[1])
                  and pair[0].weights.wq.tobytes() != pair[1].weights.wq.tobytes(), settings=quick)
    assert values[0].weights.wq.shape == values[1].weights.wq.shape  # one shape, other values


def test_the_few_shapes_spread_over_the_geometries_within_the_other_limits() -> None:
    limits = LayerLimits(max_shapes=4, max_heads=2, max_batch=2, max_capacity=5)
    shapes = few_shapes(CAPABILITIES, limits, False)
    assert len(shapes) == 4 and len({s.head_width for s in shapes}) > 1
    assert all(s.heads <= 2 and s.batch_size <= 2 and s.capacity == 5 for s in shapes)
    assert {s.batch_size for s in shapes} == {1, 2}
    assert {s.rotary_width < s.head_width for s in shapes} == {False, True}  # partial rotary, every other shape
    assert few_shapes(CAPABILITIES, LayerLimits(max_shapes=1), True)[0].kv_heads < 2  # grouped: kv < heads


def test_a_cache_that_compiles_per_shape_conforms_once_it_declares_max_shapes() -> None:
    compiling = CompilesPerShape(2)
    declared_few = Declared("compiles-per-shape", REFERENCE, compiling, layer_limits={"max_shapes": 2})
    result = run_machine("layer_cache", declared_few, property_id="few-shapes",
                         settings=profiles.settings_for("ci", database=None, max_examples=40))
    assert result.failure is None, result.failure
    assert 2 <= len(compiling.compiled) <= 4
    twin = Declared("twin-compiles-per-shape", REFERENCE, CompilesPerShape(2))
    failed = run_machine("layer_cache", twin, property_id="few-shapes-twin",
                         settings=profiles.settings_for("ci", database=None, max_examples=40)).failure
    assert isinstance(failed, NonConformance) and failed.kind.startswith("unexpected exception"), failed
