"""A family of correct float32 implementations, for testing the float32 precision rule (docs/spec.md §8.3, §15.6).

A tolerance must bound what *any* correct implementation in the declared dtype may do, whatever its summation
order, blocking or fusion -- not what the naive evaluation the rule measures happened to do. Each member here
computes the same layer or the same Llama-family model in float32 and differs from the others (and from the
naive baseline, the oracle's loops rounded to float32) only in how it rounds:

- summation order: sequential sums forward or reversed, pairwise (tree) sums, sums of blocks of three;
- blocking: attention over key blocks of two with a running max, a running sum and the partial output
  rescaled (FlashAttention's online softmax);
- fusion: exact products accumulated wider and rounded once per dot product (a wide accumulator), or
  rounded after every multiply-add (an FMA chain); the score scale folded into the query; softmax through
  the log-sum-exp; RMSNorm as a multiply by the reciprocal square root; silu through the sigmoid or tanh;
  the RoPE table by another float32 route (exp and log; ggml's running product of the frequency ratio).

Everything is float32 except where a member models a fused accumulator (``Sums.contract`` of ``wide`` and
``fma``, and the ``fused`` rotation): there the products of two float32 numbers are exact in float64 and the sum is
held in float64 (``wide``: one rounding at the end; ``fma``: rounded to float32 after each multiply-add -- a float64
sum rounded to float32 is a correctly rounded FMA except in rare double-rounding ties). A fused projection
(``[Wq | Wk | Wv]``, ``[W_gate | W_up]``) sums each output exactly as the separate ones would: what fusing changes
in a real kernel is its blocking and accumulation, which the member's ``Sums`` stands for.

Layer caches (the layer protocol, ``dtype = "float32"``, built like ``examples.minimal_adapter``'s
``make_float32_adapter`` but with GQA, both RoPE pairings, partial rotary widths and positionless layers) are
``LAYER_MEMBERS``; whole models (the model protocol, ``dtype = kv_storage = "float32"``) are ``MODEL_MEMBERS``,
among them a textbook float32 Llama with no cache at all, recomputing every sequence's whole prefix at every
call. ``python -m tests.float32_family`` checks each against the float64 oracle; ``tests/test_float32_family.py``
runs the whole suite under ``ci`` against each; ``python bench/run.py --only margins [--seeds N]`` prints each one's
worst error / tolerance under random seeds; ``KVCACHE_FAMILY=model-textbook-no-cache pytest properties
--kv-impl tests.float32_family:from_environment`` runs the suite against one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from examples.minimal_model_adapter import Cell, Context, MinimalModelAdapter, NoRoom

F32 = np.float32
F64 = np.float64


# -- how a member rounds -----------------------------------------------------------------------------------------

def _forward(p: np.ndarray) -> np.ndarray:
    acc = p[..., 0]
    for i in range(1, p.shape[-1]):
        acc = acc + p[..., i]
    return acc


def _reverse(p: np.ndarray) -> np.ndarray:
    return _forward(p[..., ::-1])


def _pairwise(p: np.ndarray) -> np.ndarray:
    while p.shape[-1] > 1:
        n = p.shape[-1]
        paired = p[..., 0:n - n % 2:2] + p[..., 1:n:2]
        p = np.concatenate([paired, p[..., n - 1:]], axis=-1) if n % 2 else paired
    return p[..., 0]


def _blocks_of_three(p: np.ndarray) -> np.ndarray:
    """Each block of three summed, then the blocks' sums (a tiled kernel's partial sums, added at the end)."""
    return _forward(np.stack([_forward(p[..., i:i + 3]) for i in range(0, p.shape[-1], 3)], axis=-1))


ORDERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "forward": _forward, "reverse": _reverse, "pairwise": _pairwise, "blocks of 3": _blocks_of_three}


def _fma_chain(exact: np.ndarray) -> np.ndarray:
    """``acc = fma(a_k, b_k, acc)`` along the last axis of exact float64 products, rounded to float32 each step."""
    acc = np.zeros(exact.shape[:-1], F32)
    for k in range(exact.shape[-1]):
        acc = (acc.astype(F64) + exact[..., k]).astype(F32)
    return acc


@dataclass(frozen=True)
class Sums:
    """How a member sums ``order``-wise in float32; ``accumulate``: ``float32`` (every product and every partial
    sum rounded), ``wide`` (exact products summed in float64, rounded once: a wide accumulator) or ``fma`` (exact
    products, the running sum rounded to float32 after each multiply-add: an FMA chain)."""

    order: str = "forward"
    accumulate: str = "float32"

    def reduce(self, p: np.ndarray) -> np.ndarray:
        """The float32 sum over the last axis."""
        if p.shape[-1] == 0:
            return np.zeros(p.shape[:-1], F32)
        return np.asarray(ORDERS[self.order](p.astype(F32)), dtype=F32)

    def contract(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``sum_k a[..., k] * b[..., k]`` (broadcast), in float32 by this member's rule."""
        if self.accumulate == "float32":
            return self.reduce(np.asarray(a, F32) * np.asarray(b, F32))
        exact = np.asarray(a, F32).astype(F64) * np.asarray(b, F32).astype(F64)  # products of float32s: exact
        if self.accumulate == "wide":
            return np.asarray(ORDERS[self.order](exact), dtype=F64).astype(F32)
        if self.order == "blocks of 3":  # an FMA chain per tile, the tiles' sums added in float32
            return _forward(np.stack([_fma_chain(exact[..., i:i + 3]) for i in range(0, exact.shape[-1], 3)], -1))
        if self.order not in ("forward", "reverse"):
            raise ValueError(f"an FMA chain runs forward or in reverse, not {self.order!r}")
        return _fma_chain(exact[..., ::-1] if self.order == "reverse" else exact)

    def matmul(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """``x [..., K] @ w [K, N]``."""
        return self.contract(x[..., None, :], np.swapaxes(w, -1, -2))


@dataclass(frozen=True)
class Numerics:
    """Every choice of a member that changes its rounding (each option computes the same function exactly)."""

    sums: Sums = field(default_factory=Sums)
    softmax: str = "divide"  # "divide": exp(s - max) / sum; "logsumexp": exp(s - lse); "online": key blocks
    key_block: int = 2  # the online softmax's block of keys
    scale: str = "divide"  # "divide": q.k / sqrt(dh); "fold": (q * rsqrt(dh)).k
    norm: str = "divide"  # RMSNorm: "divide": x / sqrt(ms + eps) * w; "rsqrt": x * (1 / sqrt(ms + eps)) * w
    silu_form: str = "divide"  # "divide": g / (1 + exp(-g)); "sigmoid": g * (1 / (1 + exp(-g))); "tanh": g * (1+tanh)/2
    table: str = "pow"  # RoPE inverse frequencies in float32: "pow" base**(-2i/r); "explog"; "ggml" running product
    rotation: str = "float32"  # "float32": a*cos - b*sin rounded per operation; "fused": one rounding

    # -- the pieces, each float32 in, float32 out --

    def inverse_frequencies(self, base: float, rotary: int) -> np.ndarray:
        exponents = -np.arange(0, rotary, 2, dtype=F32) / F32(rotary)
        if self.table == "explog":
            return np.exp(exponents * np.log(F32(base)))
        if self.table == "ggml":  # ggml_rope: theta_scale = powf(base, -2/n_dims); theta *= theta_scale per pair
            ratio = F32(base) ** (F32(-2) / F32(rotary))
            out, theta = np.empty(rotary // 2, F32), F32(1)
            for i in range(rotary // 2):
                out[i], theta = theta, F32(theta * ratio)
            return out
        return F32(base) ** exponents

    def rotate(self, x: np.ndarray, position: int, style: str, base: float, rotary: int) -> np.ndarray:
        """RoPE of ``x [..., dh]`` at ``position``: pairs (2i, 2i+1) or (i, i + r/2) of the first ``rotary``."""
        if rotary == 0:
            return x
        theta = F32(position) * self.inverse_frequencies(base, rotary)
        cos, sin = np.cos(theta), np.sin(theta)
        first = np.arange(0, rotary, 2) if style == "interleaved" else np.arange(rotary // 2)
        second = first + 1 if style == "interleaved" else first + rotary // 2
        a, b = x[..., first], x[..., second]
        out = x.copy()
        if self.rotation == "fused":
            a64, b64, c64, s64 = (v.astype(F64) for v in (a, b, cos, sin))
            out[..., first], out[..., second] = (a64 * c64 - b64 * s64).astype(F32), (a64 * s64 + b64 * c64).astype(F32)
        else:
            out[..., first], out[..., second] = a * cos - b * sin, a * sin + b * cos
        return out

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        mean_square = self.sums.contract(x, x) / F32(x.shape[-1])
        root = np.sqrt(mean_square + F32(eps))[..., None]
        if self.norm == "rsqrt":
            return x * (F32(1) / root) * weight
        return x / root * weight

    def silu(self, g: np.ndarray) -> np.ndarray:
        if self.silu_form == "tanh":
            return g * (F32(0.5) * (F32(1) + np.tanh(g * F32(0.5))))
        if self.silu_form == "sigmoid":
            return g * (F32(1) / (F32(1) + np.exp(-g)))
        return g / (F32(1) + np.exp(-g))

    def attend(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``q [..., H, dh]`` over ``keys``, ``values [..., H, T, dh]`` (kv heads repeated): ``[..., H, dh]``."""
        dh = q.shape[-1]
        if self.scale == "fold":
            q = q * (F32(1) / np.sqrt(F32(dh)))
        scores = self.sums.contract(q[..., None, :], keys)  # [..., H, T]
        if self.scale != "fold":
            scores = scores / np.sqrt(F32(dh))
        if self.softmax == "online":
            return self._online(scores, values)
        peak = scores.max(axis=-1, keepdims=True)
        if self.softmax == "logsumexp":
            lse = peak + np.log(self.sums.reduce(np.exp(scores - peak)))[..., None]
            weights = np.exp(scores - lse)
        else:
            exps = np.exp(scores - peak)
            weights = exps / self.sums.reduce(exps)[..., None]
        return self.sums.contract(weights[..., None, :], np.swapaxes(values, -1, -2))

    def _online(self, scores: np.ndarray, values: np.ndarray) -> np.ndarray:
        """FlashAttention's loop over key blocks: running max, running sum, the partial output rescaled."""
        peak = np.full(scores.shape[:-1], -np.inf, F32)
        total = np.zeros(scores.shape[:-1], F32)
        out = np.zeros((*scores.shape[:-1], values.shape[-1]), F32)
        for start in range(0, scores.shape[-1], self.key_block):
            block = scores[..., start:start + self.key_block]
            new_peak = np.maximum(peak, block.max(axis=-1))
            correction = np.exp(peak - new_peak)  # 0 for the first block
            p = np.exp(block - new_peak[..., None])
            total = total * correction + self.sums.reduce(p)
            out = out * correction[..., None] + self.sums.contract(
                p[..., None, :], np.swapaxes(values[..., start:start + self.key_block, :], -1, -2))
            peak = new_peak
        return out / total[..., None]


# -- layer caches (the layer protocol; examples/minimal_adapter.py's cache, in float32) -------------------------

class FamilyLayer:
    def __init__(self, weights: dict[str, np.ndarray], heads: int, kv_heads: int, rope: Any) -> None:
        self.weights, self.heads, self.kv_heads, self.rope = weights, heads, kv_heads, rope  # shared by with_rope
        self.head_width = weights["wq"].shape[1] // heads


class FamilyCache:
    def __init__(self, batch_size: int, kv_heads: int, head_width: int) -> None:
        self.shape = (batch_size, kv_heads, 0, head_width)
        self.keys: list[np.ndarray] = []  # one [B, KV, dh] row per position, rotated
        self.values: list[np.ndarray] = []


class Float32LayerCache:
    """A float32 layer cache computing with ``numerics``; ``fused_qkv``: one projection by ``[Wq | Wk | Wv]``."""

    version = "1"
    dtype = "float32"
    capabilities = frozenset({"gqa", "rope_interleaved", "rope_half_split", "partial_rotary", "positionless"})

    def __init__(self, name: str, numerics: Numerics, *, fused_qkv: bool = False, about: str = "") -> None:
        self.name, self.numerics, self.fused_qkv, self.about = f"float32-family-{name}", numerics, fused_qkv, about

    def create_layer(self, weights: Any, rope: Any) -> FamilyLayer:
        arrays = {name: np.array(getattr(weights, name), dtype=F32) for name in ("wq", "wk", "wv", "wo")}
        return FamilyLayer(arrays, weights.heads, weights.kv_heads, rope)

    def recreate_layer(self, layer: FamilyLayer) -> FamilyLayer:
        return FamilyLayer({n: w.copy() for n, w in layer.weights.items()}, layer.heads, layer.kv_heads, layer.rope)

    def with_rope(self, layer: FamilyLayer, rope: Any) -> FamilyLayer:
        return FamilyLayer(layer.weights, layer.heads, layer.kv_heads, rope)

    def update_weights(self, layer: FamilyLayer, weights: Any) -> None:
        for name, array in layer.weights.items():
            array[...] = getattr(weights, name)

    def create_cache(self, layer: FamilyLayer, batch_size: int, capacity: int) -> FamilyCache:
        return FamilyCache(batch_size, layer.kv_heads, layer.head_width)

    def _rotate(self, x: np.ndarray, position: int, rope: Any) -> np.ndarray:
        if rope is None:
            return x
        return self.numerics.rotate(x, position, rope.style, rope.base, rope.rotary_width)

    @np.errstate(all="ignore")  # overflowing rows (docs/spec.md §8.1) are drawn on purpose: no warnings for them
    def step(self, layer: FamilyLayer, cache: FamilyCache, x: np.ndarray) -> np.ndarray:
        w, n, dh, kv = layer.weights, self.numerics, layer.head_width, layer.kv_heads
        row, position = np.asarray(x[:, 0, :], dtype=F32), len(cache.keys)
        batch = row.shape[0]
        if self.fused_qkv:
            qkv = n.sums.matmul(row, np.concatenate([w["wq"], w["wk"], w["wv"]], axis=1))
            q, k, v = np.split(qkv, [layer.heads * dh, (layer.heads + kv) * dh], axis=1)
        else:
            q, k, v = (n.sums.matmul(row, w[name]) for name in ("wq", "wk", "wv"))
        query = self._rotate(q.reshape(batch, layer.heads, dh), position, layer.rope)
        key = self._rotate(k.reshape(batch, kv, dh), position, layer.rope)
        value = v.reshape(batch, kv, dh)
        keys = np.stack([*cache.keys, key], axis=2)  # [B, KV, T, dh]; raises on a wrong batch: nothing written yet
        values = np.stack([*cache.values, value], axis=2)
        group = layer.heads // kv
        mixed = n.attend(query, np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1))  # [B, H, dh]
        output = n.sums.matmul(mixed.reshape(batch, layer.heads * dh), w["wo"])[:, None, :]
        cache.keys.append(key)  # only now: a step that raises above changes nothing
        cache.values.append(value)
        return output

    def reset(self, cache: FamilyCache) -> None:
        cache.keys.clear()
        cache.values.clear()

    def snapshot(self, cache: FamilyCache) -> SimpleNamespace:
        stack = lambda rows: np.stack(rows, axis=2) if rows else np.zeros(cache.shape, F32)  # noqa: E731
        return SimpleNamespace(length=len(cache.keys), keys=stack(cache.keys), values=stack(cache.values))

    def error_kind(self, error: BaseException) -> str | None:
        return None  # raises nothing on purpose


LAYER_MEMBERS: dict[str, Callable[[], Float32LayerCache]] = {
    "reverse": lambda: Float32LayerCache("reverse", Numerics(sums=Sums("reverse")),
                                         about="every sum sequential in reverse order"),
    "pairwise": lambda: Float32LayerCache("pairwise", Numerics(sums=Sums("pairwise"), scale="fold",
                                                               table="explog"),
                                          about="pairwise sums; the scale folded into the query; the RoPE table by "
                                                "exp and log"),
    "flash": lambda: Float32LayerCache("flash", Numerics(sums=Sums("blocks of 3"), softmax="online", key_block=2),
                                       about="projections in blocks of 3; online softmax over key blocks of 2"),
    "fused": lambda: Float32LayerCache("fused", Numerics(sums=Sums("forward", "wide"), softmax="logsumexp",
                                                         rotation="fused"), fused_qkv=True,
                                       about="fused QKV; exact products in a wide accumulator, one rounding per dot; "
                                             "softmax by log-sum-exp; the rotation rounded once"),
    "fma": lambda: Float32LayerCache("fma", Numerics(sums=Sums("reverse", "fma"), softmax="online", key_block=3,
                                                     scale="fold", table="ggml"),
                                     about="FMA chains in reverse; online softmax over key blocks of 3; the scale "
                                           "folded; ggml's RoPE table"),
}


# -- whole models (the model protocol; examples/minimal_model_adapter.py's cells, in float32) -------------------

@dataclass(frozen=True)
class Float32Weights:
    """A model's weights in float32, matrices transposed to ``(in, out)`` for ``Sums.matmul``."""

    config: Any
    embedding: np.ndarray
    layers: list[dict[str, np.ndarray]]
    output_norm: np.ndarray
    output: np.ndarray  # [D, V]

    @classmethod
    def of(cls, config: Any, weights: Any) -> Float32Weights:
        def layer(w: Any) -> dict[str, np.ndarray]:
            out = {name: np.array(getattr(w, name), F32).T.copy() for name in ("wq", "wk", "wv", "wo", "w_gate",
                                                                                 "w_up", "w_down")}
            out["attention_norm"], out["ffn_norm"] = np.array(w.attention_norm, F32), np.array(w.ffn_norm, F32)
            out["wqkv"] = np.concatenate([out["wq"], out["wk"], out["wv"]], axis=1)  # fused projections
            out["w_gate_up"] = np.concatenate([out["w_gate"], out["w_up"]], axis=1)
            return out

        output = weights.embedding if weights.output is None else weights.output
        return cls(config, np.array(weights.embedding, F32), [layer(w) for w in weights.layers],
                   np.array(weights.output_norm, F32), np.array(output, F32).T.copy())


class Forward:
    """The float32 forward pieces of one member."""

    def __init__(self, numerics: Numerics, fused: bool) -> None:
        self.n, self.fused = numerics, fused

    def qkv(self, w: Float32Weights, layer: int, hidden: np.ndarray) -> tuple[np.ndarray, ...]:
        """Unrotated queries ``[n, H, dh]``, keys and values ``[n, KV, dh]`` of ``hidden [n, D]``."""
        c, lw, n = w.config, w.layers[layer], self.n
        x = n.rms_norm(hidden, lw["attention_norm"], c.norm_eps)
        if self.fused:
            q, k, v = np.split(n.sums.matmul(x, lw["wqkv"]), [c.heads * c.head_width,
                                                              (c.heads + c.kv_heads) * c.head_width], axis=-1)
        else:
            q, k, v = (n.sums.matmul(x, lw[name]) for name in ("wq", "wk", "wv"))
        rows = len(hidden)
        return (q.reshape(rows, c.heads, c.head_width), k.reshape(rows, c.kv_heads, c.head_width),
                v.reshape(rows, c.kv_heads, c.head_width))

    def rotate(self, w: Float32Weights, x: np.ndarray, position: int) -> np.ndarray:
        c = w.config
        return self.n.rotate(x, position, c.rope_style, c.rope_base, c.head_width)

    def attention(self, w: Float32Weights, layer: int, query: np.ndarray, keys: np.ndarray,
                  values: np.ndarray) -> np.ndarray:
        """A rotated ``query [H, dh]`` over rotated ``keys``, ``values [m, KV, dh]``: ``[D]`` after ``wo``."""
        c = w.config
        group = c.heads // c.kv_heads
        heads_first = lambda a: np.repeat(np.swapaxes(a, 0, 1), group, axis=0)  # noqa: E731  [H, m, dh]
        mixed = self.n.attend(query, heads_first(keys), heads_first(values))  # [H, dh]
        return self.n.sums.matmul(mixed.reshape(-1), w.layers[layer]["wo"])

    def feed_forward(self, w: Float32Weights, layer: int, hidden: np.ndarray) -> np.ndarray:
        c, lw, n = w.config, w.layers[layer], self.n
        x = n.rms_norm(hidden, lw["ffn_norm"], c.norm_eps)
        if self.fused:
            gate, up = np.split(n.sums.matmul(x, lw["w_gate_up"]), 2, axis=-1)
        else:
            gate, up = n.sums.matmul(x, lw["w_gate"]), n.sums.matmul(x, lw["w_up"])
        return hidden + n.sums.matmul(n.silu(gate) * up, lw["w_down"])

    def logits(self, w: Float32Weights, hidden: np.ndarray) -> np.ndarray:
        return self.n.sums.matmul(self.n.rms_norm(hidden, w.output_norm, w.config.norm_eps), w.output)


class Float32CellModel(MinimalModelAdapter):
    """The minimal model adapter's unified store of cells (keys kept unrotated, rotated when read: a shift only
    moves positions), computing in float32 with ``numerics``; ``fused``: one projection by ``[Wq | Wk | Wv]`` and
    one by ``[W_gate | W_up]``. Adds divides and sliding windows to what the example declares."""

    version = "1"
    dtype = "float32"
    kv_storage = "float32"
    capabilities = (MinimalModelAdapter.capabilities - {"float64"}) | {"rope_half_split", "seq_divide",
                                                                       "sliding_window"}

    def __init__(self, name: str, numerics: Numerics, *, fused: bool = False, about: str = "") -> None:
        self.name, self.forward, self.about = f"float32-family-{name}", Forward(numerics, fused), about

    def create_model(self, config: Any, weights: Any) -> Float32Weights:
        return Float32Weights.of(config, weights)

    @np.errstate(all="ignore")
    def decode_batch(self, context: Context, batch: Any) -> np.ndarray:
        w, f = context.model, self.forward
        c, n = w.config, len(batch.tokens)
        if n > context.capacity - len(context.cells):
            raise NoRoom(f"{n} tokens, {context.capacity - len(context.cells)} free cells")
        new = [Cell(p, [], [], {s}) for p, s in zip(batch.positions, batch.sequences)]
        hidden = w.embedding[list(batch.tokens)]  # [n, D]
        for layer in range(c.layers):
            q, k, v = f.qkv(w, layer, hidden)
            for i, cell in enumerate(new):  # every new cell's key and value first: the batch is causal
                cell.keys.append(k[i])
                cell.values.append(v[i])
            attended = np.empty_like(hidden)
            for i, (position, seq) in enumerate(zip(batch.positions, batch.sequences)):
                seen = [cell for cell in context.of(seq) + [cell for cell in new if seq in cell.sequences]
                        if cell.position <= position and (c.window is None or position - cell.position < c.window)]
                keys = np.stack([f.rotate(w, cell.keys[layer], cell.position) for cell in seen])  # [m, KV, dh]
                values = np.stack([cell.values[layer] for cell in seen])
                attended[i] = f.attention(w, layer, f.rotate(w, q[i], position), keys, values)
            hidden = f.feed_forward(w, layer, hidden + attended)
        logits = f.logits(w, hidden)
        context.cells.extend(new)  # committed last: a batch that raised left nothing behind
        wanted: np.ndarray = logits[[bool(x) for x in batch.logits]]
        return wanted

    def seq_divide(self, context: Context, seq: int, p0: int, p1: int, d: int) -> None:
        if d < 1:  # before any cell moves (a numpy int divided by 0 gives 0 where a Python int raises)
            raise ValueError(f"divisor {d!r}")
        for cell in context.of(seq):
            if self._in(cell, p0, p1):
                cell.position //= d  # a shared cell moves for every sequence holding it


class Refused(Exception):
    """A sequence operation the no-cache model cannot do (it keeps no keys or values to keep)."""


@dataclass
class Token:
    position: int
    token: int
    sequence: int


@dataclass
class Tokens:
    """A no-cache context: the tokens each sequence holds, per store (one if unified, else one per sequence)."""

    model: Float32Weights
    capacity: int  # per store
    sequences: int
    unified: bool
    held: list[Token] = field(default_factory=list)

    def of(self, seq: int) -> list[Token]:
        return sorted((t for t in self.held if t.sequence == seq), key=lambda t: t.position)

    def used(self, seq: int) -> int:
        return len(self.held) if self.unified else len(self.of(seq))


class TextbookNoCacheModel:
    """A textbook float32 Llama in plain numpy with no KV cache: each call recomputes every sequence it decodes from
    its first token (``x @ W.T`` by numpy's BLAS, ``exp(s - max) / sum``, ``x / sqrt(mean(x^2) + eps) * w``).
    Without keys and values kept it can only keep whole prefixes: it declares removals to the end
    (``removal: end_only``), keeps and clears, and no copies, shifts, divides or saved states."""

    version = "1"
    dtype = "float32"
    kv_storage = "float32"
    name = "float32-family-textbook-no-cache"
    about = "no cache: every call recomputes each sequence's whole prefix; numpy matmuls (BLAS order)"
    capabilities = frozenset({"whole_model", "gqa", "rope_interleaved", "rope_half_split", "sliding_window",
                              "fixed_capacity", "seq_remove", "seq_keep"})
    model_policy: ClassVar[dict[str, Any]] = {"contexts": ["unified", "per_sequence"], "removal": "end_only"}
    hf_style = False  # transformers' LlamaForCausalLM's forms instead: see HfStyleNoCacheModel

    def create_model(self, config: Any, weights: Any) -> Float32Weights:
        return Float32Weights.of(config, weights)

    def create_context(self, model: Float32Weights, config: Any) -> Tokens:
        return Tokens(model, config.cells if config.unified else config.cells // config.max_sequences,
                      config.max_sequences, config.unified)

    def context_cells(self, context: Tokens) -> int:
        return context.capacity

    def _forward(self, w: Float32Weights, tokens: list[Token]) -> np.ndarray:
        """One sequence's tokens, in position order, through the whole model: their logits ``[n, V]``."""
        c = w.config
        dh, group = c.head_width, c.heads // c.kv_heads
        positions = np.array([t.position for t in tokens])
        if self.hf_style:  # transformers: inv_freq = 1 / base ** (arange(0, dh, 2) / dh)
            inverse = F32(1) / F32(c.rope_base) ** (np.arange(0, dh, 2, dtype=F32) / F32(dh))
        else:
            inverse = F32(c.rope_base) ** (-np.arange(0, dh, 2, dtype=F32) / F32(dh))
        theta = positions[:, None].astype(F32) * inverse
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]  # [n, 1, dh/2]
        first = np.arange(0, dh, 2) if c.rope_style == "interleaved" else np.arange(dh // 2)
        second = first + 1 if c.rope_style == "interleaved" else first + dh // 2

        def rope(x: np.ndarray) -> np.ndarray:
            out = x.copy()
            a, b = x[..., first], x[..., second]
            out[..., first], out[..., second] = a * cos - b * sin, a * sin + b * cos
            return out

        def norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
            if self.hf_style:  # LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps))
                return weight * (x * (F32(1) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(c.norm_eps))))
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(c.norm_eps)) * weight

        visible = positions[None, :] <= positions[:, None]
        if c.window is not None:
            visible &= positions[:, None] - positions[None, :] < c.window
        hidden = w.embedding[[t.token for t in tokens]]
        n = len(tokens)
        for lw in w.layers:
            x = norm(hidden, lw["attention_norm"])
            q = rope((x @ lw["wq"]).reshape(n, c.heads, dh))
            k = np.repeat(rope((x @ lw["wk"]).reshape(n, c.kv_heads, dh)), group, axis=1)
            v = np.repeat((x @ lw["wv"]).reshape(n, c.kv_heads, dh), group, axis=1)
            scores = np.einsum("ihd,jhd->hij", q, k)
            scores = scores * F32(dh ** -0.5) if self.hf_style else scores / np.sqrt(F32(dh))
            scores = np.where(visible[None], scores, F32(-np.inf))
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            hidden = hidden + np.einsum("hij,jhd->ihd", p, v).reshape(n, -1) @ lw["wo"]
            x = norm(hidden, lw["ffn_norm"])
            gate = x @ lw["w_gate"]
            silu = gate * (F32(1) / (F32(1) + np.exp(-gate))) if self.hf_style else gate / (F32(1) + np.exp(-gate))
            hidden = hidden + (silu * (x @ lw["w_up"])) @ lw["w_down"]
        out: np.ndarray = norm(hidden, w.output_norm) @ w.output
        return out

    @np.errstate(all="ignore")
    def decode_batch(self, context: Tokens, batch: Any) -> np.ndarray:
        new = [Token(int(p), int(t), int(s)) for t, p, s in zip(batch.tokens, batch.positions, batch.sequences)]
        for seq in {t.sequence for t in new}:
            if not 0 <= seq < context.sequences:
                raise IndexError(f"sequence {seq}")
            mine = sum(t.sequence == seq or context.unified for t in new)
            if context.used(seq) + mine > context.capacity:
                raise NoRoom(f"{mine} tokens, {context.capacity - context.used(seq)} free cells")
        rows: dict[int, np.ndarray] = {}
        for seq in sorted({t.sequence for t in new}):
            theirs = context.of(seq) + [t for t in new if t.sequence == seq]
            logits = self._forward(context.model, theirs)
            for token, row in zip(theirs, logits):
                rows[id(token)] = row
        wanted = [rows[id(t)] for t, want in zip(new, batch.logits) if want]
        context.held.extend(new)  # committed last
        return np.array(wanted, dtype=F32).reshape(len(wanted), context.model.config.vocab)

    def clear(self, context: Tokens) -> None:
        context.held.clear()

    def seq_pos_min(self, context: Tokens, seq: int) -> int:
        return min((t.position for t in context.of(seq)), default=-1)

    def seq_pos_max(self, context: Tokens, seq: int) -> int:
        return max((t.position for t in context.of(seq)), default=-1)

    def can_shift(self, context: Tokens) -> bool:
        return False

    def seq_remove(self, context: Tokens, seq: int, p0: int, p1: int) -> None:
        low = 0 if p0 < 0 else p0
        chosen = [t for t in context.held if (seq < 0 or t.sequence == seq) and t.position >= low
                  and (p1 < 0 or t.position < p1)]
        if p1 >= 0 and any((seq < 0 or t.sequence == seq) and t.position >= p1 for t in context.held):
            raise Refused(f"[{p0}, {p1}) would leave tokens after it: nothing to recompute them from")
        context.held = [t for t in context.held if t not in chosen]

    def seq_keep(self, context: Tokens, seq: int) -> None:
        context.held = [t for t in context.held if t.sequence == seq]

    def error_kind(self, error: BaseException) -> str | None:
        return "full" if isinstance(error, NoRoom) else "refused" if isinstance(error, Refused) else None


class HfStyleNoCacheModel(TextbookNoCacheModel):
    """The textbook model written as transformers' ``LlamaForCausalLM`` in float32 is, without a cache: RoPE's
    inverse frequencies ``1 / base ** (2i / dh)``, RMSNorm ``w * (x * rsqrt(mean(x^2) + eps))``, scores multiplied
    by ``dh ** -0.5``, ``silu(g) = g * sigmoid(g)``."""

    name = "float32-family-hf-style-no-cache"
    about = "no cache, transformers' forms: 1/pow RoPE table, rsqrt RMSNorm, scale multiplied, silu by sigmoid"
    hf_style = True


def _reference_float32() -> Any:
    """impl's vectorised reference in float32 with a float32 cache: keys stored rotated (re-rotated and rounded at
    every shift, as llama.cpp's cache is), per-sequence contexts and saved states too."""
    from impl.model_conformance import LowPrecisionModelAdapter

    adapter = LowPrecisionModelAdapter("float32", "float32")
    adapter.name = "float32-family-reference"
    adapter.about = "impl's reference in float32 (BLAS matmuls, rotated keys re-rotated at each shift)"  # type: ignore[attr-defined]
    return adapter


MODEL_MEMBERS: dict[str, Callable[[], Any]] = {
    "textbook-no-cache": TextbookNoCacheModel,
    "hf-style-no-cache": HfStyleNoCacheModel,
    "reverse": lambda: Float32CellModel("reverse", Numerics(sums=Sums("reverse")),
                                        about="cells; every sum sequential in reverse order"),
    "flash-pairwise": lambda: Float32CellModel("flash-pairwise", Numerics(sums=Sums("pairwise"), softmax="online",
                                                                          key_block=2, norm="rsqrt",
                                                                          table="explog"),
                                               about="cells; pairwise sums; online softmax over key blocks of 2; "
                                                     "RMSNorm by rsqrt; RoPE table by exp and log"),
    "fused": lambda: Float32CellModel("fused", Numerics(sums=Sums("forward", "wide"), softmax="logsumexp",
                                                        norm="rsqrt", silu_form="sigmoid", rotation="fused",
                                                        scale="fold"),
                                      fused=True,
                                      about="cells; fused QKV and gate|up; wide accumulator, one rounding per dot; "
                                            "softmax by log-sum-exp; RMSNorm by rsqrt; silu by the sigmoid"),
    "fma-tiled": lambda: Float32CellModel("fma-tiled", Numerics(sums=Sums("blocks of 3", "fma"), softmax="online",
                                                                key_block=3, silu_form="tanh", table="ggml"),
                                          about="cells; FMA chains in tiles of 3; online softmax over key blocks of "
                                                "3; silu by tanh; ggml's RoPE table"),
    "reference": _reference_float32,
}


# -- running a member ------------------------------------------------------------------------------------------

MACHINES = {"layer": "layer_cache", "model": "model"}  # the machine that judges each rule's members
MEMBERS = {"layer": LAYER_MEMBERS, "model": MODEL_MEMBERS}


def from_environment() -> Any:
    """The member named by ``KVCACHE_FAMILY=<rule>-<member>`` (``layer-reverse``, ``model-textbook-no-cache``), for
    ``--kv-impl tests.float32_family:from_environment``: the whole suite against one member."""
    import os

    kind, _, name = os.environ.get("KVCACHE_FAMILY", "").partition("-")
    if name not in MEMBERS.get(kind, {}):
        raise ValueError(f"KVCACHE_FAMILY must be one of "
                         f"{', '.join(f'{k}-{n}' for k, members in MEMBERS.items() for n in members)}")
    return MEMBERS[kind][name]()


def run_member(kind: str, name: str, settings: Any, *, trace_dir: Any = None, shrink_seconds: float | None = None,
               property_id: str | None = None) -> Any:
    """One search of ``kind``'s machine against member ``name`` under Hypothesis ``settings`` (a ``RunResult``:
    its ``worst`` is the (error, tolerance) closest to failing)."""
    from kvcache_conformance.run.runner import run_machine

    return run_machine(MACHINES[kind], MEMBERS[kind][name](), property_id=property_id or f"float32-family-{kind}",
                       settings=settings, trace_dir=trace_dir, shrink_seconds=shrink_seconds)


# -- each member against the float64 oracle ----------------------------------------------------------------------

def layer_error(make: Callable[[], Any], seed: int) -> float:
    """The worst relative error of a layer member's outputs and cached rows on one random layer (GQA, half-split
    RoPE over part of the head, 3 rows a batch of 2) against the float64 oracle."""
    from kvcache_conformance.oracle import AttentionWeights, RopeConfig, full_prefix_attention

    rng = np.random.default_rng(seed)
    heads, kv, dh, width, length = 4, 2, 6, 5, 6
    shapes = [(width, heads * dh), (width, kv * dh), (width, kv * dh), (heads * dh, width)]
    weights = AttentionWeights(*(rng.uniform(-1, 1, shape) for shape in shapes), heads=heads, kv_heads=kv)
    rope = RopeConfig(("interleaved", "half_split")[seed % 2], 10000.0, 4, 64)
    x = rng.uniform(-1, 1, (2, length, width))
    adapter = make()
    layer = adapter.create_layer(weights, rope)
    cache = adapter.create_cache(layer, 2, 8)
    got = np.concatenate([adapter.step(layer, cache, x[:, t:t + 1].copy()) for t in range(length)], axis=1)
    truth = full_prefix_attention(x, weights, rope)
    held = adapter.snapshot(cache)
    return max(float(np.abs(np.asarray(a, F64) - b).max() / np.abs(b).max())
               for a, b in ((got, truth.outputs), (held.keys, truth.keys), (held.values, truth.values)))


def model_error(make: Callable[[], Any], seed: int) -> float:
    """The worst relative error of a model member's logits on one random GQA model (windowed for odd seeds),
    decoding a prompt of 5 tokens and then 2 single tokens, against the float64 oracle."""
    from kvcache_conformance.oracle import ContextConfig, ModelBatch, ModelConfig, random_model_weights
    from kvcache_conformance.oracle.model import full_model

    config = ModelConfig(vocab=12, model_width=8, layers=2, heads=4, kv_heads=2, head_width=6, ffn_width=10,
                         rope_style=("interleaved", "half_split")[seed % 2], window=3 if seed % 2 else None)
    weights = random_model_weights(config, seed)
    tokens = [int(t) for t in np.random.default_rng(seed).integers(0, config.vocab, 7)]
    adapter = make()
    model = adapter.create_model(config, weights)
    context = adapter.create_context(model, ContextConfig(cells=8, max_sequences=2))
    got = [adapter.decode_batch(context, ModelBatch(tuple(tokens[:5]), tuple(range(5)), (1,) * 5, (True,) * 5))]
    for t in (5, 6):
        got.append(adapter.decode_batch(context, ModelBatch((tokens[t],), (t,), (1,), (True,))))
    truth = full_model(tokens, config, weights)
    return float(np.abs(np.concatenate(got).astype(F64) - truth).max() / np.abs(truth).max())


if __name__ == "__main__":
    for kind, members, error in (("layer", LAYER_MEMBERS, layer_error), ("model", MODEL_MEMBERS, model_error)):
        for name, make in members.items():
            print(f"{kind} {name:20} worst relative error against float64, 4 inputs: "
                  f"{max(error(make, seed) for seed in range(4)):.2e}")
