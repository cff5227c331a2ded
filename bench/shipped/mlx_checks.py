"""Direct checks behind the mlx-lm entries' re-readings (catalogue.toml), run in a release's environment:

    PYTHONPATH=. ~/.cache/kvcache-conformance/shipped/envs/mlx-lm-0.28.0-py3.11-*/bin/python -m bench.shipped.mlx_checks

Each program goes through ``adapters.mlx_lm:rotating_window`` (a ``RotatingKVCache`` window layer) and is compared
with the same ``Attention`` over all its valid rows at once under a numpy window mask (key p seen from q iff
q - W < p <= q). It prints the largest error per position, or the exception a call raised.

- ``upstream``: mlx-lm's test_rotating_cache_updates (W 8: a 10-row chunk, 3 rows, a 3-row chunk);
- ``raise_then_rows``: W 4, 6 rows, a chunk of another batch (it raises), 4 more rows.
"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np

from adapters import mlx_lm


def _layer(width: int, head_width: int, seed: int) -> tuple[mlx_lm.MlxLmAdapter, mlx_lm.Layer, np.random.Generator]:
    rng = np.random.default_rng(seed)
    weights = SimpleNamespace(wq=rng.normal(size=(width, head_width)), wk=rng.normal(size=(width, head_width)),
                              wv=rng.normal(size=(width, head_width)), wo=rng.normal(size=(head_width, width)),
                              heads=1, kv_heads=1)
    rope = SimpleNamespace(style="half_split", base=10000.0, rotary_width=head_width, max_positions=64)
    adapter = mlx_lm.rotating_window()
    return adapter, adapter.create_layer(weights, rope), rng


def _errors(layer: mlx_lm.Layer, x: np.ndarray, got: np.ndarray, window: int) -> np.ndarray:
    q, p = np.arange(x.shape[1])[:, None], np.arange(x.shape[1])[None]
    want = np.array(layer.attention(mx.array(x.astype(np.float32)), mx.array((p <= q) & (p > q - window)), None))
    return np.round(np.abs(got - want).max(axis=(0, 2)), 6)


def upstream() -> None:
    adapter, layer, rng = _layer(8, 4, 1)
    cache = adapter.create_cache(layer, 1, 64, window=8)
    x = rng.normal(size=(1, 16, 8))
    try:
        outputs = [adapter.append(layer, cache, x[:, :10])]
        outputs += [adapter.step(layer, cache, x[:, i:i + 1]) for i in (10, 11, 12)]
        outputs += [adapter.append(layer, cache, x[:, 13:])]
    except ValueError as error:
        print(f"upstream: raised {error}")
        return
    print(f"upstream: {cache.cache.keys.shape[2]} rows after the last chunk; max error per position "
          f"{_errors(layer, x, np.concatenate(outputs, axis=1), 8)}")


def raise_then_rows() -> None:
    adapter, layer, rng = _layer(4, 4, 2)
    cache = adapter.create_cache(layer, 1, 64, window=4)
    x = rng.normal(size=(1, 10, 4))
    outputs = [adapter.step(layer, cache, x[:, i:i + 1]) for i in range(6)]
    try:
        adapter.append(layer, cache, rng.normal(size=(2, 2, 4)))
    except ValueError as error:
        print(f"raise_then_rows: the chunk of batch 2 raised {str(error)[:60]}...")
    outputs += [adapter.step(layer, cache, x[:, i:i + 1]) for i in range(6, 10)]
    print(f"raise_then_rows: max error per position {_errors(layer, x, np.concatenate(outputs, axis=1), 4)}")


if __name__ == "__main__":
    print(mlx_lm.VERSION)
    upstream()
    raise_then_rows()
