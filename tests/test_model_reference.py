"""The reference whole model (impl.model) against the oracle's cell model: random programs of every
operation, compared after every step -- logits at 1e-12, positions exactly, refusals by kind and as
changing nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from impl import errors
from impl.model import LlamaModel, ModelContext
from impl.model_conformance import (
    LowPrecisionModelAdapter,
    ModelReferenceAdapter,
    make_float32_model_adapter,
    make_model_adapter,
    make_uint4_extreme_model_adapter,
    make_uint4_groups_model_adapter,
)
from kvcache_conformance.judge.tolerance import Judge
from kvcache_conformance.oracle import (
    FLOAT64,
    MODEL_PRESETS,
    ContextConfig,
    ModelBatch,
    ModelConfig,
    random_model_weights,
)
from kvcache_conformance.oracle.model import OUTSIDE, CellContext, Model, ModelRefusal, kv_storage_of
from kvcache_conformance.protocol import ModelAdapter
from kvcache_conformance.protocol.declarations import required_methods
from kvcache_conformance.protocol.kinds import declared

SEQUENCES = 3


class Pair:
    """The oracle's context and the reference's, driven alike; for a low-precision reference also the oracle's
    naive baseline (docs/spec.md §15.6), whose error sets the tolerance."""

    def __init__(self, config: ModelConfig, seed: int, context: ContextConfig,
                 adapter: ModelReferenceAdapter | None = None, **policy: Any) -> None:
        weights = random_model_weights(config, seed)
        self.config = config
        self.oracle = CellContext(Model(config, weights), context, **policy)
        self.adapter = adapter or ModelReferenceAdapter()
        self.naive: CellContext | None = None
        self.judge = Judge.for_model(self.adapter, FLOAT64)
        numbers = self.judge.naive
        if numbers is not None:
            storage = kv_storage_of(self.judge.storage or self.judge.kv_storage, numbers)
            self.naive = CellContext(Model(config, weights, numbers=numbers, kv_storage=storage), context, **policy)
        self.worst = 0.0  # the largest error / tolerance of a decode
        self.adapter.model_policy = {**ModelReferenceAdapter.model_policy, "shared_copies":
                                     policy.get("shared_copies", True),
                                     "copy_unified": policy.get("copy_into_nonempty", "merge"),
                                     "copy_per_sequence": policy.get("copy_into_nonempty", "merge")}
        self.impl = self.adapter.create_context(self.adapter.create_model(config, weights), context)
        self.saved: list[tuple[Any, Any]] = []

    def positions(self) -> list[tuple[int, int]]:
        return [(self.adapter.seq_pos_min(self.impl, s), self.adapter.seq_pos_max(self.impl, s))
                for s in range(SEQUENCES)]

    def both(self, oracle_call: Callable[[CellContext], Any], impl_call: Callable[[Any], Any]) -> Any:
        """Run a call on both sides: the same refusal kind (the impl unchanged), or both results (the oracle's
        exact and naive ones, then the reference's)."""
        try:
            expected = oracle_call(self.oracle)
            naive = None if self.naive is None else oracle_call(self.naive)
        except ModelRefusal as refusal:  # outside the model no kind is due: the reference refuses it with its own
            before = self.positions()
            with pytest.raises(errors.KvCacheError) as raised:
                impl_call(self.impl)
            assert refusal.kind == OUTSIDE or self.adapter.error_kind(raised.value) == refusal.kind, (
                refusal, raised.value)
            assert self.positions() == before
            return None
        return expected, naive, impl_call(self.impl)

    def check_positions(self) -> None:
        assert self.positions() == [(self.oracle.pos_min(s), self.oracle.pos_max(s)) for s in range(SEQUENCES)]


def random_step(pair: Pair, rng: np.random.Generator) -> None:
    """One random operation on both sides, valid or not; the logits of a decode compared."""
    oracle, adapter = pair.oracle, pair.adapter
    seq = int(rng.integers(0, SEQUENCES))
    roll = rng.random()

    def a_range() -> tuple[int, int]:  # any negative end is open, not -1 alone
        p0, p1 = (int(v) for v in rng.integers(-3, 10, 2))
        return p0, p1

    if roll < 0.4:  # a batch of one or two sequences, sometimes malformed
        tokens, positions, sequences = [], [], []
        for s in {seq, int(rng.integers(0, SEQUENCES))}:
            start = oracle.pos_max(s) + 1 if oracle.pos_max(s) >= 0 else int(rng.integers(0, 4))
            count = int(rng.integers(1, 4))
            if start + count >= 60:
                continue
            tokens += [int(t) for t in rng.integers(0, pair.config.vocab, count)]
            positions += list(range(start, start + count))
            sequences += [s] * count
        if rng.random() < 0.15 and tokens:  # malformed: a token, a position or a sequence out of place
            which = int(rng.integers(0, 3))
            index = int(rng.integers(0, len(tokens)))
            [tokens, positions, sequences][which][index] += [pair.config.vocab, 3, SEQUENCES][which]
        wants = tuple(bool(w) for w in rng.integers(0, 2, len(tokens)))
        as_int = (int, np.int64, np.int32)[int(rng.integers(0, 3))]  # numpy ids and positions are ints too
        batch = ModelBatch(tuple(map(as_int, tokens)), tuple(map(as_int, positions)), tuple(sequences), wants)
        result = pair.both(lambda o: o.decode(batch), lambda i: adapter.decode_batch(i, batch))
        if result is not None:
            expected, naive, got = result
            assert got.shape == expected.shape
            if expected.size:
                tolerance = pair.judge.tolerance(expected, naive)  # one per token under a narrower cache
                ratio = float(np.max(np.abs(got.astype(np.float64) - expected) / tolerance))
                pair.worst = max(pair.worst, ratio)
                assert ratio <= 1.0, (ratio, tolerance)
    elif roll < 0.5:
        p0, p1 = a_range()
        target = -1 if rng.random() < 0.2 else seq
        pair.both(lambda o: o.remove(target, p0, p1), lambda i: adapter.seq_remove(i, target, p0, p1))
    elif roll < 0.62:
        dst = int(rng.integers(0, SEQUENCES + (1 if rng.random() < 0.1 else 0)))
        p0, p1 = (-1, -1) if rng.random() < 0.5 or oracle.copy_into_nonempty == "whole_only" else a_range()
        pair.both(lambda o: o.copy(seq, dst, p0, p1), lambda i: adapter.seq_copy(i, seq, dst, p0, p1))
    elif roll < 0.66:
        pair.both(lambda o: o.keep(seq), lambda i: adapter.seq_keep(i, seq))
    elif roll < 0.78:
        p0, p1 = a_range()
        past = rng.random() < 0.1  # to max_positions or past it: outside the model, refused changing nothing
        delta = 64 - max(oracle.pos_max(seq), 0) if past else int(rng.integers(-4, 5))
        if past or oracle.pos_max(seq) + delta < 56:
            pair.both(lambda o: o.shift(seq, p0, p1, delta), lambda i: adapter.seq_shift(i, seq, p0, p1, delta))
    elif roll < 0.85:
        p0, p1 = a_range()
        d = int(rng.integers(0, 4))
        pair.both(lambda o: o.divide(seq, p0, p1, d), lambda i: adapter.seq_divide(i, seq, p0, p1, d))
    elif roll < 0.92:
        saving: list[Any] = []
        result = pair.both(lambda o: saving.append(o.save(seq)), lambda i: adapter.save_sequence(i, seq))
        if result is not None:
            pair.saved.append((*saving, result[2]))  # the exact oracle's, the naive one's if any, the impl's
    elif roll < 0.98 and pair.saved:
        saved = pair.saved[int(rng.integers(0, len(pair.saved)))]
        states = iter(saved[:-1])
        pair.both(lambda o: o.load(seq, next(states)), lambda i: adapter.load_sequence(i, seq, saved[-1]))
    else:
        pair.both(lambda o: o.clear(), lambda i: adapter.clear(i))
    pair.check_positions()


CASES = [  # preset, context, policy
    ("tiny", ContextConfig(24, SEQUENCES, True), {}),
    ("tiny-half-split", ContextConfig(24, SEQUENCES, False), {}),
    ("tiny-window3", ContextConfig(12, SEQUENCES, True), {"shared_copies": False}),
    ("tiny-tied", ContextConfig(30, SEQUENCES, False), {"copy_into_nonempty": "replace"}),
    ("tiny-mha", ContextConfig(18, SEQUENCES, True), {"copy_into_nonempty": "replace"}),
    ("tiny", ContextConfig(18, SEQUENCES, False), {"copy_into_nonempty": "whole_only"}),
    ("tiny-gemma3", ContextConfig(18, SEQUENCES, True), {}),  # per-layer windows, a local base, the switches
    ("tiny-interleaved", ContextConfig(18, SEQUENCES, False), {"shared_copies": False}),
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_reference_agrees_with_the_oracle_on_random_programs(case: int, seed: int) -> None:
    preset, context, policy = CASES[case]
    pair = Pair(MODEL_PRESETS[preset], seed, context, **policy)
    rng = np.random.default_rng(1000 * case + seed)
    for _ in range(40):
        random_step(pair, rng)


def test_the_float32_reference_with_a_float16_cache_is_within_the_precision_rule() -> None:
    """llama.cpp's default configuration, as the reference computes it: within 2 x the naive baseline's error +
    one float16 unit + 8 float32 ulps of the exact oracle on every decode of the random programs, shifts and
    divides (keys rounded to float16 again after each re-rotation) included."""
    worst = 0.0
    for case, (preset, context, policy) in enumerate(CASES):
        for seed in range(4):
            pair = Pair(MODEL_PRESETS[preset], seed, context, make_float32_model_adapter(), **policy)
            rng = np.random.default_rng(1000 * case + seed)
            for _ in range(40):
                random_step(pair, rng)
            worst = max(worst, pair.worst)
    assert 0.0 < worst <= 1.0
    print(f"float32 with a float16 cache: worst error / tolerance {worst:.3f}")


@pytest.mark.parametrize("format", ["q8_0", "q4_0"])
def test_blocks_along_the_kv_row_are_within_the_rule_with_heads_of_16(format: str) -> None:
    """A block format cut from each token's whole kv row, two kv heads of 16 to a block: the reference agrees
    with the oracle's baseline cut the same way, on random programs of every operation; cut per head, the same
    model is refused (a head of 16 is not a whole block)."""
    config = dataclasses.replace(MODEL_PRESETS["tiny"], head_width=16, kv_heads=2, heads=4)
    worst = 0.0
    for case, (_, context, policy) in enumerate(CASES[:2]):
        for seed in range(3):
            pair = Pair(config, seed, context, LowPrecisionModelAdapter("float32", format, along_row=True), **policy)
            rng = np.random.default_rng(1000 * case + seed)
            for _ in range(30):
                random_step(pair, rng)
            worst = max(worst, pair.worst)
    assert 0.0 < worst <= 1.0
    print(f"{format} along the kv row, heads of 16: worst error / tolerance {worst:.3f}")
    per_head = LowPrecisionModelAdapter("float32", format)
    model = per_head.create_model(config, random_model_weights(config, 0))
    with pytest.raises(errors.InvalidModelConfig, match="a head of 16"):
        per_head.create_context(model, ContextConfig(8, SEQUENCES, True))


@pytest.mark.parametrize("factory", [make_uint4_groups_model_adapter, make_uint4_extreme_model_adapter])
def test_affine_groups_as_the_model_cache_are_within_the_rule(factory: Callable[[], ModelReferenceAdapter]) -> None:
    """Affine groups of 4 (from the minimum; the larger extreme exact, as mlx): the reference agrees with the
    oracle's baseline over the same groups on random programs of every operation, heads of 4 and 8."""
    worst = 0.0
    for case, (preset, context, policy) in enumerate(CASES):
        for seed in range(2):
            config = MODEL_PRESETS[preset]
            if seed:
                config = dataclasses.replace(config, head_width=8)
            pair = Pair(config, seed, context, factory(), **policy)
            rng = np.random.default_rng(1000 * case + seed)
            for _ in range(30):
                random_step(pair, rng)
            worst = max(worst, pair.worst)
    assert 0.0 < worst <= 1.0
    print(f"{factory.__name__}: worst error / tolerance {worst:.3f}")


class Float16CacheDeclaredFloat32(ModelReferenceAdapter):
    """Stores its cache in float16 but declares a float32 one: the rule it is judged by is too tight."""

    capabilities = ModelReferenceAdapter.capabilities - {"float64"}
    dtype, kv_storage = "float32", "float32"

    def create_context(self, model: LlamaModel, config: ContextConfig) -> ModelContext:
        return ModelContext(model, config.cells, config.max_sequences, config.unified, kv_dtype="float16")


def test_a_float16_cache_declared_float32_fails_the_rule() -> None:
    failed = 0
    for seed in range(4):
        pair = Pair(MODEL_PRESETS["tiny"], seed, ContextConfig(24, SEQUENCES, True), Float16CacheDeclaredFloat32())
        rng = np.random.default_rng(seed)
        try:
            for _ in range(40):
                random_step(pair, rng)
        except AssertionError:
            failed += 1
    assert failed >= 3


def test_a_shift_re_rotates_the_stored_keys_and_back() -> None:
    """The reference stores keys rotated (as llama.cpp does); shifting there and back leaves them within
    rounding of what they were."""
    config = MODEL_PRESETS["tiny"]
    context = ModelContext(LlamaModel(config, random_model_weights(config, 1)), 16, 2, True)
    context.decode([1, 2, 3, 4], [0, 1, 2, 3], [0] * 4, [True] * 4)
    before = context.keys.copy()
    context.shift(0, 1, -1, 5)
    assert np.abs(context.keys - before).max() > 1e-3
    context.shift(0, 6, -1, -5)
    np.testing.assert_allclose(context.keys, before, rtol=0, atol=1e-14)


def test_an_end_only_context_refuses_a_removal_that_leaves_cells_after_it_and_changes_nothing() -> None:
    config = MODEL_PRESETS["tiny"]
    context = ModelContext(LlamaModel(config, random_model_weights(config, 1)), 16, 2, True, end_only_removal=True)
    context.decode([1, 2, 3, 4, 5], [0, 1, 2, 3, 0], [0, 0, 0, 0, 1], [True] * 5)
    members = context.members.copy()
    for seq, p0, p1 in ((0, 1, 2), (0, -1, 3), (-1, 0, 1)):  # the middle, from the start, of every sequence
        with pytest.raises(errors.SequenceOperationRefused):
            context.remove(seq, p0, p1)
        assert (context.members == members).all()
    context.remove(0, 2, -1)  # to the end
    context.remove(1, -1, 7)  # all of sequence 1, a range past its end
    assert (context.pos_min(0), context.pos_max(0), context.pos_max(1)) == (0, 1, -1)
    context.remove(-1, -1, 2)  # every cell left
    assert context.pos_max(0) == -1


def test_a_context_numbering_positions_ignores_the_batch_s_and_runs_each_sequence_on_from_its_largest() -> None:
    config = MODEL_PRESETS["tiny"]
    model = LlamaModel(config, random_model_weights(config, 1))
    numbered = ModelContext(model, 16, 2, True, numbers_positions=True)
    given = ModelContext(model, 16, 2, True)
    logits = numbered.decode([1, 2, 3], [7, 7, 9], [0, 1, 0], [True] * 3)  # the positions given are not read
    np.testing.assert_array_equal(logits, given.decode([1, 2, 3], [0, 0, 1], [0, 1, 0], [True] * 3))
    for context in (numbered, given):
        context.remove(0, 0, 1)  # sequence 0 holds position 1 alone: its next is 2, not its count of cells
        context.shift(1, -1, -1, 3)
    np.testing.assert_array_equal(numbered.decode([4, 5], [0, 0], [0, 1], [True] * 2),
                                  given.decode([4, 5], [2, 4], [0, 1], [True] * 2))
    numbered.remove(-1, -1, -1)
    numbered.decode([6], [5], [1], [True])
    assert (numbered.pos_min(1), numbered.pos_max(1)) == (0, 0)  # emptied, it starts again at 0


@pytest.mark.parametrize("unified", [True, False])
def test_a_growing_context_takes_past_its_cells_what_a_larger_one_takes(unified: bool) -> None:
    config = MODEL_PRESETS["tiny"]
    model = LlamaModel(config, random_model_weights(config, 1))
    grown = ModelContext(model, 4, 2, unified, grows=True, shared_copies=False)
    large = ModelContext(model, 64, 2, unified, shared_copies=False)
    for context in (grown, large):
        context.decode([1, 2, 3], [0, 1, 2], [0] * 3, [True] * 3)
        context.copy(0, 1, -1, -1)
        context.load(1, context.save(0))
        context.remove(0, 1, 2)
    np.testing.assert_array_equal(grown.decode([4, 5, 6, 7, 8], [3, 4, 5, 6, 3], [0, 0, 0, 0, 1], [True] * 5),
                                  large.decode([4, 5, 6, 7, 8], [3, 4, 5, 6, 3], [0, 0, 0, 0, 1], [True] * 5))
    assert grown.capacity > 4 and [grown.pos_max(s) for s in (0, 1)] == [6, 3]
    with pytest.raises(errors.ContextFull):
        ModelContext(model, 4, 2, unified).decode([1] * 5, list(range(5)), [0] * 5, [True] * 5)


def test_a_token_of_several_sequences_is_one_cell_of_each_as_a_shared_copy_makes_it() -> None:
    config = MODEL_PRESETS["tiny"]
    model = LlamaModel(config, random_model_weights(config, 1))
    shared, copied = ModelContext(model, 16, 3, True), ModelContext(model, 16, 3, True)
    logits = shared.decode([1, 2, 3, 4], [0, 1, 2, 2], [(0, 2), (0, 2), 2, 0], [True] * 4)
    np.testing.assert_array_equal(logits[:2], copied.decode([1, 2], [0, 1], [0, 0], [True] * 2))
    copied.copy(0, 2, -1, -1)
    np.testing.assert_array_equal(logits[2:], copied.decode([3, 4], [2, 2], [2, 0], [True] * 2))
    assert int(shared.members.any(axis=2).sum()) == 4 and [shared.pos_max(s) for s in range(3)] == [2, -1, 2]
    for bad in ([(0, 0)], [()], [(0, 3)]):
        with pytest.raises(errors.MalformedBatch):
            shared.decode([1], [3], bad, [True])


def test_a_shift_past_max_positions_is_refused_before_anything_moves() -> None:
    config = MODEL_PRESETS["tiny"]  # 64 positions
    context = ModelContext(LlamaModel(config, random_model_weights(config, 1)), 16, 2, True)
    context.decode([1, 2, 3, 4], [0, 1, 2, 3], [0] * 4, [True] * 4)
    context.copy(0, 1, -1, -1)
    keys, positions = context.keys.copy(), context.positions.copy()
    for p0, delta in ((-1, 61), (3, 61), (-2, 1000)):
        with pytest.raises(errors.SequenceOperationRefused):
            context.shift(0, p0, -1, delta)
        assert (context.keys == keys).all() and (context.positions == positions).all()
    context.shift(0, 3, -1, 60)  # to 63, the last position
    assert (context.pos_max(0), context.pos_max(1)) == (63, 63)


def test_numpy_integer_ids_and_positions_give_the_same_logits() -> None:
    config = MODEL_PRESETS["tiny"]
    results = []
    for kind in (int, np.int64, np.int32):
        context = ModelContext(LlamaModel(config, random_model_weights(config, 1)), 16, 2, True)
        results.append(context.decode(tuple(map(kind, (3, 1, 4))), tuple(map(kind, (0, 1, 2))), (0, 0, 1),
                                      (True, True, True)))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    context = ModelContext(LlamaModel(config, random_model_weights(config, 1)), 16, 2, True)
    with pytest.raises(errors.MalformedBatch):
        context.decode((True,), (0,), (0,), (True,))


@pytest.mark.parametrize("change", ["clear", "shift", "decode over freed cells"])
def test_a_saved_state_is_self_contained(change: str) -> None:
    """A state is a copy of the cells: changing, clearing or refilling the context saved from changes nothing of
    it, and it loads into a fresh context of another cell count."""
    config = MODEL_PRESETS["tiny"]
    adapter = make_model_adapter()
    model = adapter.create_model(config, random_model_weights(config, 1))
    context = adapter.create_context(model, ContextConfig(8, 2, True))
    adapter.decode_batch(context, ModelBatch.of_sequence(0, [3, 1, 4], 0))
    state = adapter.save_sequence(context, 0)
    copy = dataclasses.replace(state, **{f: getattr(state, f).copy() for f in ("positions", "tokens", "keys",
                                                                               "values")})
    if change == "clear":
        adapter.clear(context)
    elif change == "shift":
        adapter.seq_shift(context, 0, -1, -1, 5)
    else:
        adapter.clear(context)
        adapter.decode_batch(context, ModelBatch.of_sequence(1, [2, 2, 2, 2], 0))
    for field in ("positions", "tokens", "keys", "values"):
        assert (getattr(state, field) == getattr(copy, field)).all(), field
    expected = adapter.decode_batch(adapter.create_context(model, ContextConfig(8, 2, True)),
                                    ModelBatch.of_sequence(0, [3, 1, 4, 1], 0))[-1:]
    fresh = adapter.create_context(model, ContextConfig(13, 2, True))
    adapter.load_sequence(fresh, 1, state)
    np.testing.assert_allclose(adapter.decode_batch(fresh, ModelBatch.of_sequence(1, [1], 3)), expected,
                               rtol=0, atol=1e-12)


def test_the_adapter_has_what_it_declares() -> None:
    adapter = make_model_adapter()
    assert isinstance(adapter, ModelAdapter)
    for method in required_methods(declared(adapter.capabilities), layer_caches=False):
        assert callable(getattr(adapter, method)), method


def test_bad_models_and_contexts_are_typed_errors() -> None:
    config = MODEL_PRESETS["tiny"]
    weights = random_model_weights(config, 1)
    with pytest.raises(errors.InvalidModelConfig):
        LlamaModel(config, dataclasses.replace(weights, output=None))
    with pytest.raises(errors.InvalidModelConfig):
        LlamaModel(config, dataclasses.replace(weights, layers=weights.layers[:1]))
    with pytest.raises(errors.InvalidModelConfig):
        LlamaModel(object(), weights)
    model = LlamaModel(config, weights)
    for cells, sequences, unified in ((0, 1, True), (1, 2, False), (4, True, True)):
        with pytest.raises(errors.InvalidModelConfig):
            ModelContext(model, cells, sequences, unified)
    with pytest.raises(errors.InvalidModelConfig):
        ModelContext(model, 4, 1, True, copy_into_nonempty="swap")


def test_the_float32_norm_reference_is_judged_by_the_norm_baseline_and_not_at_1e_12() -> None:
    """Every RMSNorm in float32 inside a float64 model: far past 1e-12, within the mixed rule's 2 x the oracle's
    own float32-norm error + 8 float32 ulps; the oracle's float32 norm differs from its float64 one."""
    from impl.model_conformance import make_float32_norm_model_adapter
    from kvcache_conformance.oracle import mixed_precision
    from kvcache_conformance.oracle.model import full_model

    config = dataclasses.replace(MODEL_PRESETS["tiny"], tied_output=False)
    weights = random_model_weights(config, 4)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    adapter = make_float32_norm_model_adapter()
    context = adapter.create_context(adapter.create_model(config, weights), ContextConfig(cells=16, max_sequences=1))
    got = adapter.decode_batch(context, ModelBatch.of_sequence(0, tokens, 0))
    truth = full_model(tokens, config, weights)
    baseline = full_model(tokens, config, weights, numbers=mixed_precision({"norm": "float32"}))
    error, base = np.abs(got - truth).max(), np.abs(baseline - truth).max()
    assert 1e-12 < error <= 2 * base + 8 * np.finfo(np.float32).eps * max(1.0, np.abs(truth).max())
    assert 1e-12 < base < 1e-5
    judge = Judge.for_model(adapter, FLOAT64)
    assert judge.components == {"norm": "float32"} and judge.naive is not None


def test_bad_widened_models_are_typed_errors() -> None:
    """A pattern without a window, another activation, a switched norm missing or one given with its switch off."""
    gemma = MODEL_PRESETS["tiny-gemma3"]
    weights = random_model_weights(gemma, 1)
    for config in (SimpleNamespace(**{**vars_of(gemma), "window": None, "local_rope_base": None}),
                   SimpleNamespace(**{**vars_of(gemma), "activation": "relu"}),
                   SimpleNamespace(**{**vars_of(gemma), "window_pattern": 1})):
        with pytest.raises(errors.InvalidModelConfig):
            LlamaModel(config, weights)
    layers = (dataclasses.replace(weights.layers[0], q_norm=None), *weights.layers[1:])
    with pytest.raises(errors.InvalidModelConfig):
        LlamaModel(gemma, dataclasses.replace(weights, layers=layers))
    llama = dataclasses.replace(gemma, qk_norm=False)
    with pytest.raises(errors.InvalidModelConfig):
        LlamaModel(llama, weights)


def vars_of(config: ModelConfig) -> dict[str, Any]:
    return {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
