"""The small decoder of the prefix-reuse experiment, recomputed from the whole sequence.

Token embedding, a position convention, ``blocks`` blocks of causal attention
with the residual ``h <- h + tanh(attention(h))``, no FFN, no LayerNorm, and
logits through the tied embedding. Positions are either absolute sinusoids
added to the embedding (the seed's) or RoPE inside attention. Every block runs
in the oracle's own scalars, so mpmath mode keeps its precision end to end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .attention import Vector, causal_attention, project
from .config import AttentionWeights, OracleInputError, RopeConfig, RopeStyle
from .numbers import FLOAT64, NumberSystem

PositionConvention = Literal["sinusoidal", "rope"]


@dataclass(frozen=True)
class DecoderConfig:
    """Shapes and conventions of the decoder; the defaults are the seed's model."""

    vocab: int = 32
    model_width: int = 16
    blocks: int = 2
    heads: int = 1
    kv_heads: int = 1
    positions: PositionConvention = "sinusoidal"
    max_positions: int = 64
    window: int | None = None  # sliding window W: position i sees keys i-W+1..i
    sinusoid_base: float = 10000.0  # PE[p, 2i] = sin(p / base**(2i/D)), PE[p, 2i+1] = cos(...)
    rope_style: RopeStyle = "interleaved"
    rope_base: float = 10000.0
    rotary_width: int | None = None  # None: the whole head

    def __post_init__(self) -> None:
        for name in ("vocab", "model_width", "blocks", "heads", "kv_heads", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OracleInputError(f"{name} must be an int >= 1, got {value!r}")
        if self.model_width % self.heads or self.heads % self.kv_heads:
            raise OracleInputError("model width must divide into heads, and heads into kv heads")
        if self.positions not in ("sinusoidal", "rope"):
            raise OracleInputError(f"positions must be 'sinusoidal' or 'rope', got {self.positions!r}")
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise OracleInputError(f"window must be None or an int >= 1, got {self.window!r}")
        _ = self.rope  # building it validates the RoPE fields

    @property
    def head_width(self) -> int:
        return self.model_width // self.heads

    @property
    def rope(self) -> RopeConfig:
        """The attention's RoPE; with sinusoidal positions it rotates nothing (rotary width 0)."""
        width = 0 if self.positions == "sinusoidal" else (
            self.head_width if self.rotary_width is None else self.rotary_width)
        return RopeConfig(self.rope_style, self.rope_base, width, self.max_positions)


PRESETS: dict[str, DecoderConfig] = {
    "seed": DecoderConfig(),  # vocab 32, width 16, 2 blocks, 1 head, sinusoidal positions
    "seed-window4": DecoderConfig(window=4),
    "seed-rope": DecoderConfig(positions="rope"),
    "seed-rope-window4": DecoderConfig(positions="rope", window=4),
}


@dataclass(frozen=True, eq=False)
class DecoderWeights:
    embedding: np.ndarray  # [vocab, D], also the output projection (tied)
    blocks: tuple[AttentionWeights, ...] = field(default_factory=tuple)


def random_decoder_weights(config: DecoderConfig, seed: int) -> DecoderWeights:
    """Untrained weights from ``seed``: embedding ~ N(0, 1), projections ~ N(0, 1/D)."""
    rng = np.random.default_rng(seed)
    d, dh = config.model_width, config.head_width
    scale = 1.0 / np.sqrt(d)
    blocks = tuple(
        AttentionWeights(rng.normal(0, scale, (d, config.heads * dh)), rng.normal(0, scale, (d, config.kv_heads * dh)),
                         rng.normal(0, scale, (d, config.kv_heads * dh)), rng.normal(0, scale, (config.heads * dh, d)),
                         heads=config.heads, kv_heads=config.kv_heads)
        for _ in range(config.blocks))
    return DecoderWeights(embedding=rng.normal(0, 1, (config.vocab, d)), blocks=blocks)


@dataclass(frozen=True, eq=False)
class DecoderTrace:
    """The decoder on one token sequence, rounded to float64.

    ``logits [T, vocab]``; per block, ``keys`` (rotated under RoPE) and
    ``values`` ``[KV, T, dh]`` -- what a cache of that block must hold.
    """

    logits: np.ndarray
    keys: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]


def sinusoid(position: int, width: int, base: float, numbers: NumberSystem) -> Vector:
    """Absolute position encoding: feature ``2i`` is ``sin``, ``2i+1`` is ``cos`` of ``p / base**(2i/D)``."""
    encoding = []
    for f in range(width):
        angle = position / numbers.number(base) ** (numbers.number(2 * (f // 2)) / width)
        encoding.append(numbers.sin(angle) if f % 2 == 0 else numbers.cos(angle))
    return encoding


def full_decoder(tokens: Sequence[int], config: DecoderConfig, weights: DecoderWeights, *,
                 numbers: NumberSystem = FLOAT64) -> DecoderTrace:
    """Recompute every position of ``tokens`` through every block."""
    if not tokens or any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < config.vocab
                         for t in tokens):
        raise OracleInputError(f"tokens must be a non-empty sequence of ints in [0, {config.vocab})")
    if len(tokens) > config.max_positions:
        raise OracleInputError(f"{len(tokens)} tokens exceed max positions {config.max_positions}")
    if weights.embedding.shape != (config.vocab, config.model_width) or len(weights.blocks) != config.blocks:
        raise OracleInputError("weights do not match the configuration")
    embedding = [[numbers.number(float(v)) for v in row] for row in weights.embedding]
    hidden = [list(embedding[t]) for t in tokens]  # [T][D]
    if config.positions == "sinusoidal":
        hidden = [[h + p for h, p in zip(row, sinusoid(i, config.model_width, config.sinusoid_base, numbers))]
                  for i, row in enumerate(hidden)]
    keys, values = [], []
    for block in weights.blocks:
        attention = causal_attention(hidden, block, config.rope, window=config.window, numbers=numbers)
        hidden = [[h + numbers.tanh(a) for h, a in zip(row, out)] for row, out in zip(hidden, attention.outputs)]
        keys.append(_rounded(attention.keys, numbers))
        values.append(_rounded(attention.values, numbers))
    tied = [list(column) for column in zip(*embedding)]  # [D][vocab]: logits = h @ E^T
    logits = np.array([[numbers.to_float(v) for v in project(row, tied)] for row in hidden])
    return DecoderTrace(logits=logits, keys=tuple(keys), values=tuple(values))


def greedy_generate(prompt: Sequence[int], steps: int, config: DecoderConfig, weights: DecoderWeights, *,
                    numbers: NumberSystem = FLOAT64) -> list[int]:
    """``steps`` tokens, each the argmax of the last logits of a full recomputation."""
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(np.argmax(full_decoder(tokens, config, weights, numbers=numbers).logits[-1])))
    return tokens[len(prompt):]


def _rounded(heads: list[list[Vector]], numbers: NumberSystem) -> np.ndarray:
    return np.array([[[numbers.to_float(v) for v in row] for row in head] for head in heads])
