"""The float32 precision rule passes correct float32 implementations (docs/spec.md §8.3, §15.6; issue 36).

Each member of the family (tests/float32_family.py) computes in float32 and differs from the others in summation
order, blocking or fusion; each is correct (within 1e-5 relative of the float64 oracle, checked here). The rule
must pass every one under ``ci``: a tolerance bounds what any correct implementation in the declared dtype may do,
not what the naive evaluation happened to do. Their margins under random seeds are printed by
``python bench/run.py --only margins``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcache_conformance.run import profiles
from tests.float32_family import LAYER_MEMBERS, MODEL_MEMBERS, layer_error, model_error, run_member

FAMILY = [("layer", name) for name in LAYER_MEMBERS] + [("model", name) for name in MODEL_MEMBERS]


@pytest.mark.parametrize("name", sorted(LAYER_MEMBERS))
def test_a_layer_member_is_correct(name: str) -> None:
    assert max(layer_error(LAYER_MEMBERS[name], seed) for seed in range(4)) < 1e-5


@pytest.mark.parametrize("name", sorted(MODEL_MEMBERS))
def test_a_model_member_is_correct(name: str) -> None:
    assert max(model_error(MODEL_MEMBERS[name], seed) for seed in range(4)) < 1e-5


def test_the_members_round_differently() -> None:
    """No two members of a rule give the same bits: each is another way of rounding, not a copy."""
    from kvcache_conformance.oracle import (
        AttentionWeights,
        ContextConfig,
        ModelBatch,
        ModelConfig,
        RopeConfig,
        random_model_weights,
    )

    rng = np.random.default_rng(3)
    shapes = [(8, 16), (8, 8), (8, 8), (16, 8)]
    weights = AttentionWeights(*(rng.uniform(-1, 1, shape) for shape in shapes), heads=2, kv_heads=1)
    rope, x = RopeConfig("interleaved", 10000.0, 8, 64), rng.uniform(-1, 1, (1, 6, 8))
    outputs = []
    for make in LAYER_MEMBERS.values():
        adapter = make()
        layer = adapter.create_layer(weights, rope)
        cache = adapter.create_cache(layer, 1, 8)
        outputs.append(np.concatenate([adapter.step(layer, cache, x[:, t:t + 1]) for t in range(6)], axis=1))
    config = ModelConfig(vocab=12, model_width=8, layers=2, heads=4, kv_heads=2, head_width=6, ffn_width=10)
    model_weights = random_model_weights(config, 1)
    logits = []
    for make in MODEL_MEMBERS.values():
        adapter = make()
        context = adapter.create_context(adapter.create_model(config, model_weights), ContextConfig(cells=8))
        logits.append(adapter.decode_batch(context, ModelBatch((1, 2, 3, 4, 5), tuple(range(5)), (0,) * 5,
                                                               (True,) * 5)))
    for arrays in (outputs, logits):
        for i, a in enumerate(arrays):
            assert a.dtype == np.float32
            assert all(not np.array_equal(a, b) for b in arrays[i + 1:])


@pytest.mark.slow  # a whole machine run per member
@pytest.mark.parametrize("kind, name", FAMILY, ids=[f"{kind}-{name}" for kind, name in FAMILY])
def test_a_correct_float32_member_passes_under_ci(kind: str, name: str) -> None:
    result = run_member(kind, name, profiles.settings_for("ci", database=None), shrink_seconds=5.0)
    assert result.failure is None, f"worst error / tolerance {result.worst[0] / result.worst[1]:.2f}: {result.failure}"
