"""The strategies keep their promises: each generator checked against what its docstring says it draws.

Overflowing rows are checked under numpy's summation and the oracle's (its
scalar loops, left to right), and through the reference where it decides
which check rejects a row; the others by their bounds, shapes and the
capabilities they were drawn for.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from impl.attention import AttentionLayer
from impl.cache import LayerKvCache
from impl.decoder import validate_tokens
from impl.errors import InvalidTokens, NonFiniteAttention, NonFiniteError
from impl.rope import RopeConfig as ImplRopeConfig
from kvcache_conformance import generate as s
from kvcache_conformance.oracle import (
    FLOAT64,
    ROPE_STYLES,
    AttentionWeights,
    RopeConfig,
    full_prefix_attention,
    rope_rotate,
)
from kvcache_conformance.oracle.attention import project
from kvcache_conformance.protocol import Capability

MAX = s.FLOAT64_MAX
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POSITION_STYLES = [Capability.ROPE_INTERLEAVED.value, Capability.ROPE_HALF_SPLIT.value,
                   Capability.POSITIONLESS.value]
LAYER_CAPABILITIES = [Capability.GQA.value, Capability.PARTIAL_ROTARY.value, *POSITION_STYLES]


# -- weights and the arithmetic to judge rows with ------------------------------------------------------

@st.composite
def geometries(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(model width, heads, kv heads, head width) within the documented ranges."""
    heads = draw(st.integers(1, s.MAX_HEADS))
    kv_heads = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    return (draw(st.integers(1, s.MAX_MODEL_WIDTH)), heads, kv_heads,
            draw(st.sampled_from(range(2, s.MAX_HEAD_WIDTH + 1, 2))))


@st.composite
def drawn_weights(draw: st.DrawFn) -> AttentionWeights:
    """Weights as the machine draws them (dense, or about half zeros)."""
    return draw(s.attention_weights(*draw(geometries())))


@st.composite
def dense_weights(draw: st.DrawFn) -> AttentionWeights:
    """Uniform in [-1, 1] with no zero at all."""
    width, heads, kv_heads, dh = draw(geometries())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q, kv = heads * dh, kv_heads * dh
    return AttentionWeights(rng.uniform(-1, 1, (width, q)), rng.uniform(-1, 1, (width, kv)),
                            rng.uniform(-1, 1, (width, kv)), rng.uniform(-1, 1, (q, width)),
                            heads=heads, kv_heads=kv_heads)


def any_weights() -> st.SearchStrategy[AttentionWeights]:
    return st.one_of(drawn_weights(), dense_weights())


@st.composite
def ropes(draw: st.DrawFn, head_width: int, max_positions: int = 64) -> RopeConfig:
    """Any pairing and rotary width (0: no rotation) and a base from the machine's bases."""
    return RopeConfig(draw(st.sampled_from(ROPE_STYLES)), draw(s.rope_bases()),
                      draw(st.sampled_from(range(0, head_width + 1, 2))), max_positions)


def matrix(weights: AttentionWeights, name: str) -> np.ndarray:
    return {"query": weights.wq, "key": weights.wk, "value": weights.wv}[name]


def numpy_projection(row: np.ndarray, w: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        result: np.ndarray = row @ w
    return result


def oracle_projection(row: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The oracle's own projection: Python floats, summed left to right."""
    return np.array(project([float(v) for v in row], w.tolist()))


def projections(row: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    """The projection under both summations the suite knows."""
    return [numpy_projection(row, w), oracle_projection(row, w)]


def oracle_own_score(weights: AttentionWeights, row: np.ndarray, head: int, rope: RopeConfig,
                     position: int) -> float:
    """Head ``head``'s score of ``row`` with its own key at ``position``, in the oracle's scalar loops."""
    dh = weights.head_width
    kv = head // weights.group_size
    x = [float(v) for v in row]
    q = rope_rotate(project(x, weights.wq.tolist())[head * dh:(head + 1) * dh], position, rope, FLOAT64)
    k = rope_rotate(project(x, weights.wk.tolist())[kv * dh:(kv + 1) * dh], position, rope, FLOAT64)
    return float(sum((a * b for a, b in zip(q, k)), start=0.0) / math.sqrt(dh))


def reference_layer(weights: AttentionWeights, rope: RopeConfig) -> AttentionLayer:
    return AttentionLayer.from_arrays(weights.wq, weights.wk, weights.wv, weights.wo, heads=weights.heads,
                                      kv_heads=weights.kv_heads,
                                      rope=ImplRopeConfig(rope.style, rope.base, rope.rotary_width,
                                                          rope.max_positions))


def rejection(layer: AttentionLayer, cache: LayerKvCache, row: np.ndarray) -> NonFiniteError:
    with pytest.raises(NonFiniteError) as caught:
        layer.forward_incremental(row[None, None, :], cache)
    return caught.value


# -- rows overflowing a projection ------------------------------------------------------------------------

@FAST
@given(any_weights())
def test_overflowing_rows_are_finite_and_overflow_their_column(weights: AttentionWeights) -> None:
    for name, column, total in s.overflow_targets(weights):
        assert total >= 1.5
        row = s.overflowing_row(weights, name, column)
        assert np.isfinite(row).all() and np.abs(row).max() <= MAX
        for projected in projections(row, matrix(weights, name)):
            assert not np.isfinite(projected[column]), (name, column)


ISOLATED_FROM = {"key": ("value",), "value": ("key",), "query": ("key", "value")}


def check_isolated(weights: AttentionWeights) -> None:
    for name, column, row in s.isolated_overflows(weights):
        assert row.shape == (weights.model_width,)
        assert np.isfinite(row).all() and np.abs(row).max() <= MAX / 1.5, (name, column, row)
        for projected in projections(row, matrix(weights, name)):
            assert not np.isfinite(projected[column]), (name, column)
        for other in ISOLATED_FROM[name]:
            for projected in projections(row, matrix(weights, other)):
                assert np.isfinite(projected).all(), (name, column, other)
            # in any summation order: every partial sum lies between the negative and the positive terms' totals
            terms = (row / MAX)[:, None] * matrix(weights, other)
            assert np.clip(terms, 0, None).sum(axis=0).max(initial=0) <= 1 / 1.5
            assert np.clip(-terms, 0, None).sum(axis=0).max(initial=0) <= 1 / 1.5


@settings(FAST, max_examples=200)
@given(dense_weights())
def test_isolated_overflows_are_finite_with_dense_weights(weights: AttentionWeights) -> None:
    check_isolated(weights)  # the scale 1.25 / |u|^2 once came first: 1.25 / |u|^2 * max overflowed


@FAST
@given(drawn_weights())
def test_isolated_overflows_keep_their_promise(weights: AttentionWeights) -> None:
    check_isolated(weights)


def test_isolated_overflow_scale_below_one_does_not_overflow() -> None:
    """``|u|^2 = 8 * 0.39^2 < 1.25``: ``(1.25 / |u|^2) * max`` alone is inf; the row is not."""
    wk = np.zeros((8, 2))
    wk[:, 0] = 0.39
    wv = np.zeros((8, 2))
    wv[0, 0], wv[1, 0], wv[2, 1], wv[3, 1] = 1.0, -1.0, 1.0, -1.0  # orthogonal to the key column
    weights = AttentionWeights(np.eye(8)[:, :2].copy(), wk, wv, np.eye(8)[:2].copy(), heads=1, kv_heads=1)
    assert (1.25 / float(wk[:, 0] @ wk[:, 0])) * MAX == math.inf
    rows = [row for name, column, row in s.isolated_overflows(weights) if (name, column) == ("key", 0)]
    assert len(rows) == 1
    check_isolated(weights)


# -- rows overflowing a score only ----------------------------------------------------------------------

@settings(FAST, max_examples=150)
@given(any_weights(), st.data())
def test_score_overflows_overflow_the_score_only(weights: AttentionWeights, data: st.DataObject) -> None:
    """Finite row, q, k, v (any order: bounded sums of |terms|); the own score is non-finite at any position,
    in the oracle's loops and in the reference, which rejects it at the score check, with stored rows or none."""
    found = s.score_overflows(weights)
    rope = data.draw(ropes(weights.head_width))
    position = data.draw(st.integers(0, 6))
    all_columns = np.hstack([weights.wq, weights.wk, weights.wv])
    for head, sign, row in found:
        assert sign in (1.0, -1.0)
        assert np.isfinite(row).all() and np.abs(row).max() <= MAX / 1.5
        assert (np.abs(row) @ np.abs(all_columns) <= MAX / 4).all()  # q, k, v finite whatever the order
        for w in (weights.wq, weights.wk, weights.wv):
            for projected in projections(row, w):
                assert np.isfinite(projected).all()
        dh, kv = weights.head_width, head // weights.group_size
        q = numpy_projection(row, weights.wq)[head * dh:(head + 1) * dh]
        k = numpy_projection(row, weights.wk)[kv * dh:(kv + 1) * dh]
        with np.errstate(over="ignore", invalid="ignore"):  # numpy, unrotated, scaled after or before
            assert not np.isfinite(q @ k / math.sqrt(dh)) and not np.isfinite((q / math.sqrt(dh)) @ k)
        score = oracle_own_score(weights, row, head, rope, position)
        assert not math.isfinite(score), (head, sign, score)
        assert math.isnan(score) or math.copysign(1.0, score) == sign
        layer = reference_layer(weights, rope)
        cache = LayerKvCache(layer, 1, position + 1)
        for _ in range(position):  # stored keys at earlier positions: their scores stay finite
            layer.forward_incremental(np.zeros((1, 1, weights.model_width)), cache)
        error = rejection(layer, cache, row)
        assert isinstance(error, NonFiniteAttention) and error.what == "attention score of a visible key"
        assert cache.length == position


def test_score_overflows_exist_for_most_dense_weights() -> None:
    rng = np.random.default_rng(7)
    found = 0
    for _ in range(50):
        w = AttentionWeights(rng.uniform(-1, 1, (4, 8)), rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (4, 4)),
                             rng.uniform(-1, 1, (8, 4)), heads=2, kv_heads=1)
        found += bool(s.score_overflows(w))
    assert found == 50


# -- first rows overflowing the output only ---------------------------------------------------------------

@st.composite
def weights_with_silent_features(draw: st.DrawFn) -> AttentionWeights:
    """Drawn weights, with one feature whose every score term is 0 and whose value reaches the output."""
    weights = draw(drawn_weights())
    width, dh, heads = weights.model_width, weights.head_width, weights.heads
    wq, wk, wv, wo = (w.copy() for w in (weights.wq, weights.wk, weights.wv, weights.wo))
    feature = draw(st.integers(0, width - 1))
    silent = draw(st.sampled_from(["query", "key", "per feature"]))
    if silent == "query":
        wq[feature] = 0.0
    elif silent == "key":
        wk[feature] = 0.0
    else:  # in each feature of each kv head, the query of every head reading it or the key is 0
        for f in range(weights.kv_heads * dh):
            if draw(st.booleans()):
                wk[feature, f] = 0.0
            else:
                g, c = divmod(f, dh)
                for h in range(g * weights.group_size, (g + 1) * weights.group_size):
                    wq[feature, h * dh + c] = 0.0
    wq[feature] *= 0.5
    wk[feature] *= 0.5
    signs = np.where(wv[feature] >= 0, 1.0, -1.0)
    wv[feature] = signs * draw(st.floats(0.25, 0.5))
    column = draw(st.integers(0, width - 1))
    read = np.repeat(signs.reshape(weights.kv_heads, dh), weights.group_size, axis=0).ravel()  # [H*dh]
    wo[:, column] = read * np.abs(wo[:, column]).clip(0.5, 1.0)
    return AttentionWeights(wq, wk, wv, wo, heads=heads, kv_heads=weights.kv_heads)


def check_output_overflows(weights: AttentionWeights, rope: RopeConfig) -> None:
    dh, group = weights.head_width, weights.group_size
    for feature, column, row in s.output_overflows(weights):
        assert np.isfinite(row).all() and np.count_nonzero(row) == 1 and row[feature] != 0.0
        for w in (weights.wq, weights.wk, weights.wv):
            for projected in projections(row, w):
                assert np.isfinite(projected).all() and np.abs(projected).max() <= MAX / 1.5
        q, k = numpy_projection(row, weights.wq), numpy_projection(row, weights.wk)
        for h in range(weights.heads):  # every term of every score is an exact 0
            g = h // group
            assert np.all(q[h * dh:(h + 1) * dh] * k[g * dh:(g + 1) * dh] == 0.0)
        v = numpy_projection(row, weights.wv).reshape(weights.kv_heads, dh)
        mixed = np.repeat(v, group, axis=0).ravel()  # weight 1 on the lone key
        for output in projections(mixed, weights.wo):
            assert not np.isfinite(output[column])
        assert oracle_own_score(weights, row, 0, rope, 0) == 0.0
        trace = full_prefix_attention(row[None, None, :], weights, rope)
        assert not np.isfinite(trace.outputs[0, 0, column])
        assert np.isfinite(trace.keys).all() and np.isfinite(trace.values).all()
        layer = reference_layer(weights, rope)
        cache = LayerKvCache(layer, 1, 1)
        error = rejection(layer, cache, row)
        assert isinstance(error, NonFiniteAttention) and error.what == "attention output"
        assert cache.length == 0


@settings(FAST, max_examples=150)
@given(weights_with_silent_features(), st.data())
def test_output_overflows_overflow_the_output_only(weights: AttentionWeights, data: st.DataObject) -> None:
    """q, k, v finite, scores exactly 0, the output inf: numpy, the oracle and the reference agree."""
    assume(s.output_overflows(weights))
    check_output_overflows(weights, data.draw(ropes(weights.head_width)))


@FAST
@given(any_weights(), st.data())
def test_output_overflows_of_drawn_weights(weights: AttentionWeights, data: st.DataObject) -> None:
    check_output_overflows(weights, data.draw(ropes(weights.head_width)))
    if not (weights.wq == 0).any() and not (weights.wk == 0).any():
        assert s.output_overflows(weights) == []  # without exact zeros a score overflows first


# -- peaked rows --------------------------------------------------------------------------------------------

@FAST
@given(any_weights())
def test_peaked_rows_stay_in_range(weights: AttentionWeights) -> None:
    dh, group = weights.head_width, weights.group_size
    for feature, scale in s.peak_features(weights):
        assert 0.0 < scale <= s.PEAK_MAX_INPUT
        q = scale * weights.wq[feature].reshape(weights.heads, dh)
        k = scale * weights.wk[feature].reshape(weights.kv_heads, dh)
        scores = [abs(float(q[h] @ k[h // group])) / math.sqrt(dh) for h in range(weights.heads)]
        assert max(scores) == pytest.approx(s.PEAK_SCORE, rel=1e-9)


# -- inputs ------------------------------------------------------------------------------------------------

@FAST
@given(st.data(), st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple),
       st.sampled_from([0.5, 1.0, 60.0]))
def test_bounded_arrays_within_bounds(data: st.DataObject, shape: tuple[int, ...], bound: float) -> None:
    x = data.draw(s.bounded_arrays(shape, bound))
    assert x.shape == shape and x.dtype == np.float64
    assert np.isfinite(x).all() and (np.abs(x) <= bound).all()


@FAST
@given(st.data(), st.integers(1, s.MAX_BATCH), st.integers(1, s.MAX_MODEL_WIDTH))
def test_rows_are_one_valid_token(data: st.DataObject, batch: int, width: int) -> None:
    x = data.draw(s.rows(batch, width))
    assert x.shape == (batch, 1, width) and x.dtype == np.float64
    assert np.isfinite(x).all() and (np.abs(x) <= s.INPUT_BOUND).all()


# -- configurations ----------------------------------------------------------------------------------------

@st.composite
def layer_capabilities(draw: st.DrawFn) -> frozenset[str]:
    """Any set of the capabilities layer_configs reads, with at least one position convention."""
    chosen = set(draw(st.sets(st.sampled_from(LAYER_CAPABILITIES))))
    if not chosen & set(POSITION_STYLES):
        chosen.add(draw(st.sampled_from(POSITION_STYLES)))
    return frozenset(chosen)


@settings(FAST, max_examples=200)
@given(layer_capabilities(), st.data())
def test_layer_configs_respect_capabilities(capabilities: frozenset[str], data: st.DataObject) -> None:
    grouped = data.draw(st.sampled_from([None, False] + ([True] if Capability.GQA.value in capabilities else [])))
    config = data.draw(s.layer_configs(capabilities, grouped=grouped))
    w = config.weights
    assert s.requirements_of(config) <= capabilities
    assert 1 <= w.heads <= s.MAX_HEADS and w.heads % w.kv_heads == 0
    assert w.head_width % 2 == 0 and 2 <= w.head_width <= s.MAX_HEAD_WIDTH
    assert 1 <= w.model_width <= s.MAX_MODEL_WIDTH
    assert 1 <= config.batch_size <= s.MAX_BATCH and 1 <= config.capacity <= s.MAX_CAPACITY
    if Capability.GQA.value not in capabilities or grouped is False:
        assert w.kv_heads == w.heads
    if grouped:
        assert w.kv_heads < w.heads
    for array in (w.wq, w.wk, w.wv, w.wo):
        assert array.dtype == np.float64 and (np.abs(array) <= s.WEIGHT_BOUND).all()
    if config.rope is None:
        assert Capability.POSITIONLESS.value in capabilities
    else:
        assert f"rope_{config.rope.style}" in capabilities
        assert config.rope.rotary_width % 2 == 0 and 0 < config.rope.rotary_width <= w.head_width
        if Capability.PARTIAL_ROTARY.value not in capabilities:
            assert config.rope.rotary_width == w.head_width
        assert config.rope.max_positions >= config.capacity


@FAST
@given(st.data())
def test_layer_configs_fix_the_style_asked_for(data: st.DataObject) -> None:
    style = data.draw(st.sampled_from(ROPE_STYLES))
    config = data.draw(s.layer_configs(frozenset({f"rope_{r}" for r in ROPE_STYLES}), style=style))
    assert config.rope is not None and config.rope.style == style


DECODER_CAPABILITIES = [Capability.GQA.value, Capability.SLIDING_WINDOW.value, Capability.ROPE_INTERLEAVED.value,
                        Capability.ROPE_HALF_SPLIT.value, Capability.POSITIONS_SINUSOIDAL.value,
                        Capability.POSITIONS_ROPE.value]


@st.composite
def decoder_capabilities(draw: st.DrawFn) -> frozenset[str]:
    """Any set with a position convention; RoPE positions come with a pairing."""
    chosen = set(draw(st.sets(st.sampled_from(DECODER_CAPABILITIES))))
    if not chosen & {Capability.POSITIONS_SINUSOIDAL.value, Capability.POSITIONS_ROPE.value}:
        chosen.add(draw(st.sampled_from([Capability.POSITIONS_SINUSOIDAL.value, Capability.POSITIONS_ROPE.value])))
    if Capability.POSITIONS_ROPE.value in chosen and not chosen & {f"rope_{r}" for r in ROPE_STYLES}:
        chosen.add(draw(st.sampled_from([f"rope_{r}" for r in ROPE_STYLES])))
    return frozenset(chosen)


@settings(FAST, max_examples=200)
@given(decoder_capabilities(), st.sampled_from([None, True, False]), st.data())
def test_decoder_configs_respect_capabilities(capabilities: frozenset[str], windowed: bool | None,
                                              data: st.DataObject) -> None:
    if windowed:
        capabilities |= {Capability.SLIDING_WINDOW.value}
    config = data.draw(s.decoder_configs(capabilities, windowed=windowed))
    assert s.requirements_of(config) <= capabilities
    assert f"positions_{config.positions}" in capabilities
    if config.positions == "rope":
        assert f"rope_{config.rope_style}" in capabilities
    if Capability.SLIDING_WINDOW.value not in capabilities or windowed is False:
        assert config.window is None
    if windowed:
        assert config.window is not None and config.window >= 1
    if Capability.GQA.value not in capabilities:
        assert config.kv_heads == config.heads
    assert config.heads % config.kv_heads == 0 and config.model_width % config.heads == 0
    assert 2 <= config.vocab <= s.MAX_VOCAB and 1 <= config.blocks <= s.MAX_BLOCKS


@FAST
@given(st.integers(2, s.MAX_VOCAB), st.data())
def test_token_lists_within_vocab(vocab: int, data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 4))
    tokens = data.draw(s.token_lists(vocab, min_size=size, max_size=size + 2))
    assert size <= len(tokens) <= size + 2
    assert all(type(t) is int and 0 <= t < vocab for t in tokens)
    assert list(validate_tokens(tokens, vocab)) == tokens


def valid_tokens(sequence: object, vocab: int) -> bool:
    """The documented rule, independently: a non-empty list, tuple or 1-D integer array of ids in [0, vocab)."""
    if isinstance(sequence, np.ndarray):
        if sequence.ndim != 1 or sequence.dtype.kind not in "iu":
            return False
        items = sequence.tolist()
    elif isinstance(sequence, (list, tuple)):
        items = list(sequence)
        if any(type(t) is bool or not isinstance(t, (int, np.integer)) for t in items):
            return False
    else:
        return False
    return bool(items) and all(0 <= t < vocab for t in items)


@FAST
@given(st.integers(2, s.MAX_VOCAB), st.data())
def test_invalid_token_sequences_are_all_invalid(vocab: int, data: st.DataObject) -> None:
    what, sequence = data.draw(s.invalid_token_sequences(vocab))
    assert not valid_tokens(sequence, vocab), what
    with pytest.raises(InvalidTokens):
        validate_tokens(sequence, vocab)


# -- malformed rows, layouts, geometry limits ----------------------------------------------------------------

def _problems_of(value: object, batch: int, width: int) -> list[str]:
    """Every problem of a step input, found independently of the strategy, in the documented order."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float64:
        found = ["dtype"]
        if not isinstance(value, np.ndarray):
            return found  # a list, tuple or scalar: no axes to speak of
    else:
        found = []
    if value.ndim != 3:
        return [*found, "rank"]
    tokens, rows, columns = value.shape[1], value.shape[0], value.shape[2]
    return found + (["token_count"] if tokens != 1 else []) + (["batch_mismatch"] if rows != batch else []) + (
        ["width_mismatch"] if columns != width else [])


@FAST
@given(st.integers(1, s.MAX_BATCH), st.integers(1, s.MAX_MODEL_WIDTH), st.data())
def test_malformed_rows_have_exactly_the_problems_they_name(batch: int, width: int, data: st.DataObject) -> None:
    bad = data.draw(s.malformed_rows(batch, width))
    assert bad.problems and list(bad.problems) == [k.value for k in s.INPUT_CHECKS if k.value in bad.problems]
    if isinstance(bad.value, np.ndarray) or not isinstance(bad.value, (list, tuple)):
        assert _problems_of(bad.value, batch, width) == list(bad.problems)
    else:  # a nested list or tuple: rejected as not an ndarray, its shape as drawn
        assert bad.problems[0] == "dtype" and _problems_of(np.asarray(bad.value), batch, width)[0:1] != ["dtype"]
    assert bad.kind.value == bad.problems[0]
    plain = bad.value.astype(float) if isinstance(bad.value, np.ndarray) and bad.value.dtype == object else bad.value
    assert np.all(np.abs(np.asarray(plain, dtype=complex)) <= 1.0)  # in range: only the named problems matter


def test_malformed_rows_reach_every_problem_and_combinations() -> None:
    seen: set[tuple[str, ...]] = set()

    @settings(max_examples=400, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(s.malformed_rows(2, 3))
    def collect(bad: s.MalformedRow) -> None:
        seen.add(bad.problems)

    collect()
    assert {p[0] for p in seen} == {k.value for k in s.INPUT_CHECKS}
    assert any(len(p) >= 2 for p in seen)  # combined malformations, which pin the order


@FAST
@given(s.rows(2, 3), s.layouts())
def test_layouts_are_valid_rows_laid_out_as_named(row: np.ndarray, layout: tuple[str, bool]) -> None:
    from kvcache_conformance.generate.layouts import layout_of, with_layout

    laid = with_layout(row, *layout)
    assert laid.dtype == np.float64 and laid.shape == row.shape and np.array_equal(laid, row)
    assert laid.flags.writeable == layout[1]
    if layout[0] == "strided":
        assert not laid.flags.c_contiguous and not laid.flags.f_contiguous
    assert layout_of(laid)[0] in (layout[0], "C")  # a size-1 axis can make F or strided arrays C-contiguous too


@FAST
@given(st.data())
def test_layer_configs_stay_within_declared_limits(data: st.DataObject) -> None:
    from kvcache_conformance.protocol import LayerLimits

    limits = LayerLimits(model_width_is_heads_times_head_width=data.draw(st.booleans()),
                         max_heads=data.draw(st.integers(2, 4)), max_head_width=data.draw(st.sampled_from([2, 4, 8])),
                         max_batch=data.draw(st.integers(1, 3)), max_capacity=data.draw(st.integers(1, 8)))
    config = data.draw(s.layer_configs(frozenset({"rope_interleaved", "gqa"}), limits=limits))
    w = config.weights
    assert w.heads <= limits.max_heads and w.head_width <= limits.max_head_width  # type: ignore[operator]
    assert config.batch_size <= limits.max_batch and config.capacity <= limits.max_capacity  # type: ignore[operator]
    if limits.model_width_is_heads_times_head_width:
        assert w.model_width == w.heads * w.head_width


# -- the cache operations' arguments (docs/spec.md §13) -----------------------------------------------------

@FAST
@given(st.integers(1, s.MAX_BATCH), st.integers(1, s.MAX_MODEL_WIDTH), st.data())
def test_malformed_chunks_have_exactly_the_problems_they_name(batch: int, width: int, data: st.DataObject) -> None:
    bad = data.draw(s.malformed_rows(batch, width, chunked=True))
    if isinstance(bad.value, np.ndarray) and bad.value.ndim == 3:
        assert (bad.value.shape[1] == 0) == ("token_count" in bad.problems)  # any T >= 1 is a valid chunk
        assert bad.value.shape[1] <= 3


def test_malformed_chunks_reach_zero_tokens_and_valid_lengths() -> None:
    seen: set[tuple[int, bool]] = set()

    @settings(max_examples=300, database=None)
    @given(s.malformed_rows(2, 3, chunked=True))
    def collect(bad: s.MalformedRow) -> None:
        if isinstance(bad.value, np.ndarray) and bad.value.ndim == 3:
            seen.add((bad.value.shape[1], "token_count" in bad.problems))

    collect()
    assert (0, True) in seen and {(1, False), (2, False), (3, False)} <= seen


def _valid_length(value: object, length: int) -> bool:
    return type(value) is int and 0 <= value <= length


@FAST
@given(st.integers(0, 8), st.one_of(st.none(), st.integers(1, 3)), st.data())
def test_truncation_lengths_are_valid_exactly_when_they_say_so(length: int, window: int | None,
                                                                data: st.DataObject) -> None:
    n = data.draw(s.truncation_lengths(length, window))
    assert _valid_length(n.value, length) == (n.kind is None)


def test_truncation_lengths_reach_every_edge_and_every_invalid_form() -> None:
    length, window = 6, 2
    seen: set[object] = set()

    @settings(max_examples=400, database=None)
    @given(s.truncation_lengths(length, window))
    def collect(n: s.Argument) -> None:
        seen.add(repr(n.value))

    collect()
    edges = {0, length, length - 1, length - window - 1, length - window, length - window + 1}
    assert {repr(e) for e in edges} <= seen
    assert {"-1", repr(length + 1), repr(float(length)), "True", repr(str(length))} <= seen


@FAST
@given(st.integers(1, s.MAX_BATCH), st.data())
def test_batch_indices_are_valid_exactly_when_they_say_so(batch: int, data: st.DataObject) -> None:
    indices = data.draw(s.batch_indices(batch))
    array = np.asarray(indices.value)
    valid = (array.dtype.kind in "iu" and array.shape == (batch,) and bool(np.all((array >= 0) & (array < batch)))
             and not (isinstance(indices.value, list) and any(isinstance(i, bool) for i in indices.value)))
    assert valid == (indices.kind is None), indices.description


def test_batch_indices_reach_repeats_drops_and_every_problem() -> None:
    seen: set[str] = set()

    @settings(max_examples=400, database=None)
    @given(s.batch_indices(3))
    def collect(indices: s.Argument) -> None:
        if indices.kind is None:
            values = list(np.asarray(indices.value))
            seen.add("repeat" if len(set(values)) < 3 else "permutation")
            seen.add("list" if isinstance(indices.value, list) else "array")
        else:
            seen.add(indices.description.rsplit("(", 1)[1].rstrip(")"))

    collect()
    assert seen >= {"repeat", "permutation", "list", "array", "negative", "too large", "too many", "too few",
                    "floats", "bools"}


def test_invalid_indices_of_ints_come_as_lists_and_as_arrays_where_listed_or_not() -> None:
    """A cache may check an array and wrap a listed negative index (or the other way round): the batches machine's
    reorders and selects hand invalid ints both ways; valid ones, floats and bools as drawn."""
    seen: set[tuple[str, str, str]] = set()

    @settings(max_examples=400, database=None)
    @given(st.sampled_from(["reorder", "select"]).flatmap(
        lambda name: st.tuples(st.just(name), s.listed_or_not(
            s.batch_indices(3) if name == "reorder" else s.batch_selections(3)))))
    def collect(drawn: tuple[str, s.Argument]) -> None:
        name, argument = drawn
        if argument.kind is not None:
            problem = next(p for p in ("negative", "too large", "too many", "too few", "none", "floats", "bools")
                           if f"({p})" in argument.description)
            seen.add((name, problem, type(argument.value).__name__))
            assert isinstance(argument.value, list) == (" as a list (the ints of " in argument.description), argument
            assert (s.indices_problem if name == "reorder" else s.selection_problem)(argument.value, 3) is not None
            if problem in ("floats", "bools"):
                assert isinstance(argument.value, np.ndarray), argument

    collect()
    assert {(name, "negative", kind) for name in ("reorder", "select") for kind in ("list", "ndarray")} <= seen
    assert {("reorder", "too large", "list"), ("select", "none", "list")} <= seen


@pytest.mark.slow
def test_windowed_runs_cross_the_window_edge_evict_and_truncate_around_it() -> None:
    """The windowed machine's programs reach len = W - 1, W, W + 1 and beyond, truncate where rows were
    evicted (refused) and where they were not, and truncate after a reset."""
    from hypothesis.stateful import run_state_machine_as_test

    from impl.conformance import make_adapter
    from kvcache_conformance.judge.policy import Expect
    from kvcache_conformance.machines.operations import CacheOperationsMachine
    from kvcache_conformance.run import profiles

    offsets: set[int] = set()
    truncations: set[str] = set()

    class Watching(CacheOperationsMachine):
        def __init__(self) -> None:
            super().__init__(make_adapter(), style="half_split", windowed=True)

        def check_invariants(self, *args: object, **kwargs: object) -> None:
            if self.window is not None:
                offsets.add(len(self.model.rows) - self.window)
            super().check_invariants(*args, **kwargs)  # type: ignore[arg-type]

        def teardown(self) -> None:
            steps = [step.rule for step in self.tape.steps]
            for i, step in enumerate(self.tape.steps):
                if step.rule in ("truncate", "truncate_after_the_window_evicts"):
                    truncations.add("after reset" if "reset" in steps[:i] else "before any reset")
                    truncations.update(e["expect"] for e in step.expected if e["call"].startswith("truncate"))
            super().teardown()

    run_state_machine_as_test(Watching, settings=profiles.settings_for("ci", database=None))
    assert {-1, 0, 1, 2} <= offsets
    assert "after reset" in truncations
    assert {Expect.SUCCESS_OR_REFUSAL.value, Expect.SUCCESS.value} <= truncations


@FAST
@given(st.integers(1, s.MAX_CAPACITY + 2), st.data())
def test_layer_configs_draw_at_least_the_capacity_asked_for_where_limits_allow(least: int,
                                                                              data: st.DataObject) -> None:
    config = data.draw(s.layer_configs(frozenset(POSITION_STYLES), min_capacity=least))
    assert min(least, s.MAX_CAPACITY) <= config.capacity <= s.MAX_CAPACITY


@pytest.mark.slow
def test_windowed_runs_respect_a_declared_smallest_window() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    from impl.conformance import ReferenceAdapter
    from kvcache_conformance.machines.operations import CacheOperationsMachine
    from kvcache_conformance.run import profiles

    class NoWindowOfOne(ReferenceAdapter):
        layer_limits = {"min_window": 2}  # noqa: RUF012

    windows: set[int] = set()

    class Watching(CacheOperationsMachine):
        def __init__(self) -> None:
            super().__init__(NoWindowOfOne(), style="half_split", windowed=True)

        def teardown(self) -> None:
            if self.window is not None:
                windows.add(self.window)
            super().teardown()

    run_state_machine_as_test(Watching, settings=profiles.settings_for("ci", database=None, max_examples=30))
    assert windows and min(windows) == 2


def _derandomised_draws() -> list[int]:
    drawn: list[int] = []

    @settings(derandomize=True, max_examples=300, database=None, deadline=None)
    @given(st.integers(0, 10**6))
    def draw(value: int) -> None:
        drawn.append(value)

    draw()
    return drawn


def test_machine_runs_draw_without_the_constants_of_local_modules(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis draws now and then a literal of any local module imported so far. Machine runs do without them
    (runner.without_local_constants), so a derandomised program depends on the suite's strategies only, not on
    which modules are imported around it nor on their literals. Fails loudly if Hypothesis moves the private
    name it replaces."""
    from hypothesis.internal.conjecture import providers

    from kvcache_conformance.run.runner import without_local_constants

    assert callable(providers._get_local_constants) and hasattr(providers.CONSTANTS_CACHE, "cache")
    literals = [100_003 + 7 * i for i in range(400)]  # in the drawn range, found nowhere else
    (tmp_path / "kv_literals_module.py").write_text(f"LITERALS = {literals}\n")
    with without_local_constants():
        before = _derandomised_draws()
        monkeypatch.syspath_prepend(str(tmp_path))
        __import__("kv_literals_module")
        after = _derandomised_draws()
        assert len(providers._get_local_constants()) == 0
    assert before == after and not set(after) & set(literals)
    assert len(providers._get_local_constants()) > 0  # restored: Hypothesis's own behaviour outside machine runs
    outside = _derandomised_draws()
    assert set(outside) & set(literals), "Hypothesis no longer draws local constants: the replacement is moot"


def test_a_hypothesis_without_local_constants_runs_machines_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a Hypothesis release moves the private name, machine runs go on as Hypothesis draws (the test above fails
    for us): a user's run must not stop on a name that is not there."""
    from hypothesis.internal.conjecture import providers

    from kvcache_conformance.run.runner import without_local_constants

    monkeypatch.delattr(providers, "_get_local_constants")
    with without_local_constants():
        assert not hasattr(providers, "_get_local_constants")
    assert not hasattr(providers, "_get_local_constants")
