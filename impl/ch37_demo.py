"""Chapter 37's report: three cached steps, work counts, reset evidence, rejected calls.

Run ``python -m impl.ch37_demo``. The fixture layer is not printed in the
seed; it is the one its trace determines: ``Wq = Wk = Wv = I``, ``Wo`` swaps
the two head halves, and the input rows are ``(1, 0, 1, 0)``,
``(cos 1, -sin 1, 0, 1)`` and ``(cos 2, -sin 2, 1, 1)``. With head width 2
there is one RoPE pair, whose angle is the position itself, so the base and
position capacity below change no printed number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import errors
from .attention import AttentionLayer
from .cache import LayerKvCache
from .rope import RopeConfig

MODEL_WIDTH, HEADS, HEAD_WIDTH, CAPACITY = 4, 2, 2, 4
MAX_POSITIONS, ROPE_BASE = 16, 10000.0
INPUT_ROWS = np.array([
    [1.0, 0.0, 1.0, 0.0],
    [math.cos(1.0), -math.sin(1.0), 0.0, 1.0],
    [math.cos(2.0), -math.sin(2.0), 1.0, 1.0],
])


def fixture_layer(rope: RopeConfig | None = None) -> AttentionLayer:
    """A new layer (new parameter identities) with the chapter's fixture weights."""
    swap_heads = np.zeros((MODEL_WIDTH, MODEL_WIDTH))
    swap_heads[2, 0] = swap_heads[3, 1] = swap_heads[0, 2] = swap_heads[1, 3] = 1.0
    identity = np.eye(MODEL_WIDTH)
    return AttentionLayer.from_arrays(
        identity, identity, identity, swap_heads, heads=HEADS, kv_heads=HEADS,
        rope=rope or RopeConfig("interleaved", ROPE_BASE, HEAD_WIDTH, MAX_POSITIONS))


@dataclass(frozen=True)
class Step:
    position: int
    length_before: int
    length_after: int
    shape: tuple[int, ...]
    max_abs_diff: float
    output: np.ndarray
    keys: np.ndarray
    values: np.ndarray


def run_steps(layer: AttentionLayer, cache: LayerKvCache) -> list[Step]:
    """Feed the three rows; compare each output with full-prefix recomputation."""
    steps = []
    for position, row in enumerate(INPUT_ROWS):
        before = cache.length
        output = layer.forward_incremental(row[None, None, :], cache)[0, 0]
        reference = layer.forward_full(INPUT_ROWS[None, :position + 1])[0, position]
        keys = cache.keys()
        steps.append(Step(position, before, cache.length, keys.shape,
                          float(np.abs(output - reference).max()), output, keys, cache.values()))
    return steps


def rejected_calls(layer: AttentionLayer) -> dict[str, bool]:
    """Each call must raise its own error and leave its cache byte-for-byte unchanged."""
    single = INPUT_ROWS[None, :1]
    rng = np.random.default_rng(37)

    def random_layer(width: int, heads: int) -> AttentionLayer:
        return AttentionLayer.from_arrays(*(rng.uniform(-1, 1, (width, width)) for _ in range(4)),
                                          heads=heads, kv_heads=heads,
                                          rope=RopeConfig("interleaved", ROPE_BASE, 2, MAX_POSITIONS))

    full_cache = LayerKvCache(layer, 1, 1)
    layer.forward_incremental(single, full_cache)
    same_parameters = layer.parameters
    cases: dict[str, tuple[AttentionLayer, np.ndarray, LayerKvCache, type[errors.KvCacheError]]] = {
        "two_tokens": (layer, INPUT_ROWS[None, :2], LayerKvCache(layer, 1, 2), errors.TokenCountError),
        "full_cache": (layer, single, full_cache, errors.CacheFull),
        "model_mismatch": (layer, single, LayerKvCache(random_layer(8, 2), 1, CAPACITY),
                           errors.CacheModelWidthMismatch),
        "head_mismatch": (layer, single, LayerKvCache(random_layer(4, 1), 1, CAPACITY),
                          errors.CacheHeadCountMismatch),
        "layer_mismatch": (layer, single, LayerKvCache(fixture_layer(), 1, CAPACITY), errors.CacheLayerMismatch),
        "rope_mismatch": (AttentionLayer(*same_parameters, heads=HEADS, kv_heads=HEADS,
                                         rope=RopeConfig("interleaved", ROPE_BASE * 2, 2, MAX_POSITIONS)),
                          single, LayerKvCache(layer, 1, CAPACITY), errors.CacheRopeMismatch),
        "rope_positions_mismatch": (AttentionLayer(*same_parameters, heads=HEADS, kv_heads=HEADS,
                                                   rope=RopeConfig("interleaved", ROPE_BASE, 2, MAX_POSITIONS + 1)),
                                    single, LayerKvCache(layer, 1, CAPACITY), errors.CacheRopeMismatch),
        "nonfinite_projection": (layer, np.full((1, 1, MODEL_WIDTH), np.finfo(np.float64).max),
                                 LayerKvCache(layer, 1, CAPACITY), errors.NonFiniteError),
    }
    outcome = {}
    for name, (call_layer, x, cache, expected) in cases.items():
        outcome[name] = _rejected_unchanged(lambda: call_layer.forward_incremental(x, cache), cache, expected)
    outcome["unchanged"] = all(outcome.values())
    return outcome


def _rejected_unchanged(call: Callable[[], object], cache: LayerKvCache,
                        expected: type[errors.KvCacheError]) -> bool:
    before = (cache.length, cache.key_storage.tobytes(), cache.value_storage.tobytes())
    try:
        call()
    except expected:
        return before == (cache.length, cache.key_storage.tobytes(), cache.value_storage.tobytes())
    return False


def report() -> str:
    layer = fixture_layer()
    cache = LayerKvCache(layer, 1, CAPACITY)
    steps = run_steps(layer, cache)
    lines = []
    for step in steps:
        shape = ",".join(str(n) for n in step.shape)
        output = ",".join(f"{v:.9f}" for v in step.output)
        lines.append(f"step=position:{step.position} cache:{step.length_before}->{step.length_after} "
                     f"shape:[{shape}] max_abs_diff:{step.max_abs_diff:.12f} output:[{output}]")
    full_rows = sum(step.length_after for step in steps)  # a full-prefix projection redoes every row
    incremental_rows = len(steps)  # the cached step projects one row
    reused = full_rows - incremental_rows
    lines.append(f"work=full_rows_per_projection:{full_rows} incremental_rows_per_projection:{incremental_rows} "
                 f"reused_rows_per_kv_projection:{reused} avoided_rows_across_kv:{2 * reused}")

    before = cache.length
    buffers = (cache._keys, cache._values)  # the objects themselves, to prove no reallocation
    storage = (cache.key_storage.tobytes(), cache.value_storage.tobytes())
    cache.reset()
    reused_allocation = buffers[0] is cache._keys and buffers[1] is cache._values
    unchanged = storage == (cache.key_storage.tobytes(), cache.value_storage.tobytes())
    after = cache.length
    replay = run_steps(layer, cache)
    identical = all(np.array_equal(a.output, b.output) and np.array_equal(a.keys, b.keys)
                    and np.array_equal(a.values, b.values) for a, b in zip(steps, replay))
    lines.append(f"reset=before:{before} after:{after} allocation_reused:{_flag(reused_allocation)} "
                 f"storage_unchanged:{_flag(unchanged)} replay_identical:{_flag(identical)}")
    lines.append("errors=" + " ".join(f"{name}:{_flag(ok)}" for name, ok in rejected_calls(layer).items()))
    return "\n".join(lines) + "\n"


def _flag(value: bool) -> str:
    return "true" if value else "false"


def main() -> None:
    print(report(), end="")


if __name__ == "__main__":
    main()
