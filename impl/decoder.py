"""The small decoder and its model-wide decode session (chapter 38).

``Decoder``: token embedding, absolute sinusoidal positions or RoPE, blocks
of ``h <- h + tanh(attention(h))``, logits through the tied embedding.
``DecodeSession``: one layer cache per block, every binding validated when
the session is created; ``prefill`` takes a whole prompt as one vectorised
chunk, ``decode`` one token; every step prepares all blocks first and
commits all of them or none.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .attention import AttentionLayer, PreparedRows
from .cache import LayerKvCache
from .errors import CacheFull, InvalidLayerConfig, InvalidTokens, NonFiniteAttention, PrefillLongerThanWindow
from .parameters import Parameter
from .rope import RopeConfig

POSITION_CONVENTIONS = ("sinusoidal", "rope")


class Decoder:
    """Embedding plus attention blocks; the same geometry and RoPE in every block."""

    def __init__(self, embedding: Parameter, blocks: Sequence[AttentionLayer], *, positions: str,
                 window: int | None = None, sinusoid_base: float = 10000.0) -> None:
        if positions not in POSITION_CONVENTIONS:
            raise InvalidLayerConfig(f"positions must be one of {POSITION_CONVENTIONS}, got {positions!r}")
        if not blocks or len(embedding.shape) != 2:
            raise InvalidLayerConfig("a decoder needs an embedding [vocab, D] and at least one block")
        if any(block.model_width != embedding.shape[1] or block.rope != blocks[0].rope for block in blocks):
            raise InvalidLayerConfig("every block must have the embedding's width and the same RoPE")
        if positions == "sinusoidal" and blocks[0].rope.rotary_width != 0:
            raise InvalidLayerConfig("with sinusoidal positions the blocks must not rotate (rotary width 0)")
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise InvalidLayerConfig(f"window must be None or an int >= 1, got {window!r}")
        self.embedding, self.blocks = embedding, tuple(blocks)
        self.positions, self.window, self.sinusoid_base = positions, window, float(sinusoid_base)

    @classmethod
    def from_arrays(cls, embedding: np.ndarray, blocks: Sequence[Sequence[np.ndarray]], *, heads: int,
                    kv_heads: int, rope: RopeConfig, positions: str, window: int | None = None,
                    sinusoid_base: float = 10000.0) -> Decoder:
        """A decoder owning new parameters with copies of these values."""
        layers = [AttentionLayer.from_arrays(*block, heads=heads, kv_heads=kv_heads, rope=rope) for block in blocks]
        return cls(Parameter("embedding", embedding), layers, positions=positions, window=window,
                   sinusoid_base=sinusoid_base)

    @property
    def vocab(self) -> int:
        return self.embedding.shape[0]

    @property
    def model_width(self) -> int:
        return self.embedding.shape[1]

    @property
    def max_positions(self) -> int:
        return self.blocks[0].rope.max_positions

    def embed(self, tokens: np.ndarray, start: int) -> np.ndarray:
        """Rows ``[1, T, D]`` for ``tokens`` at absolute positions ``start ..``."""
        hidden: np.ndarray = self.embedding.value[tokens][None].copy()
        if self.positions == "sinusoidal":
            hidden += sinusoids(np.arange(start, start + len(tokens)), self.model_width, self.sinusoid_base)
        return hidden

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Tied output projection: ``hidden @ E^T``."""
        logits: np.ndarray = hidden @ self.embedding.value.T
        return logits

    def forward_full(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits ``[T, vocab]`` of every position, recomputed from scratch (no cache)."""
        ids = validate_tokens(tokens, self.vocab)
        hidden = self.embed(ids, 0)
        for block in self.blocks:
            hidden = hidden + np.tanh(block.forward_full(hidden, window=self.window))
        logits: np.ndarray = self.logits(hidden)[0]  # [T, vocab]
        return logits


def sinusoids(positions: np.ndarray, width: int, base: float) -> np.ndarray:
    """``[T, D]``: feature ``2i`` is ``sin``, ``2i+1`` is ``cos`` of ``p / base**(2i/D)``."""
    pair = np.arange(width) // 2
    angles = positions[:, None] / base ** ((2 * pair) / width)[None, :]
    encoding: np.ndarray = np.where(np.arange(width) % 2 == 0, np.sin(angles), np.cos(angles))
    return encoding


def validate_tokens(tokens: object, vocab: int) -> np.ndarray:
    """A non-empty 1-D sequence of integer ids in ``[0, vocab)``; floats (even ``1.0``) and bools rejected."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise InvalidTokens(f"a 1-D integer array is needed, got {tokens.ndim}-D {tokens.dtype}")
        items = [int(t) for t in tokens]
    elif isinstance(tokens, (list, tuple)):
        bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, (int, np.integer))]
        if bad:
            raise InvalidTokens(f"token ids must be ints, got {bad[0]!r} ({type(bad[0]).__name__})")
        items = [int(t) for t in tokens]
    else:
        raise InvalidTokens(f"a list, tuple or 1-D integer array is needed, got {type(tokens).__name__}")
    if not items:
        raise InvalidTokens("the token sequence is empty")
    outside = [t for t in items if not 0 <= t < vocab]
    if outside:
        raise InvalidTokens(f"token id {outside[0]} is outside [0, {vocab})")
    return np.array(items, dtype=np.int64)


class DecodeSession:
    """One cache per block of ``model``; steps that commit across all blocks or none."""

    def __init__(self, model: Decoder, capacity: int, keeps_every_row: bool = False,
                 prefill_within_window: bool = False) -> None:
        self.model = model
        self.prefill_within_window = prefill_within_window  # refuse a prefill of more than W tokens
        self.caches = tuple(LayerKvCache(block, 1, capacity, window=model.window, keeps_every_row=keeps_every_row)
                            for block in model.blocks)
        for block, cache in zip(model.blocks, self.caches):
            cache.check_binding(block)  # once, here; each step re-checks only what can change
        self.capacity = capacity

    @property
    def length(self) -> int:
        """Tokens processed since creation or reset."""
        return self.caches[0].length

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Process a prompt in one vectorised chunk; logits ``[T, vocab]`` of its positions."""
        return self._advance(validate_tokens(tokens, self.model.vocab))

    def decode(self, token: int) -> np.ndarray:
        """Process one token; logits ``[vocab]`` for the next one."""
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise InvalidTokens(f"decode takes one int token id, got {token!r}")
        logits: np.ndarray = self._advance(validate_tokens([token], self.model.vocab))[-1]
        return logits

    def generate(self, prompt: Sequence[int], steps: int) -> list[int]:
        """Greedy continuation: prefill the prompt, then decode each argmax."""
        next_token = int(np.argmax(self.prefill(prompt)[-1]))
        generated = [next_token]
        for _ in range(steps - 1):
            next_token = int(np.argmax(self.decode(next_token)))
            generated.append(next_token)
        return generated[:steps]

    def reset(self) -> None:
        for cache in self.caches:
            cache.reset()

    def _advance(self, tokens: np.ndarray) -> np.ndarray:
        """Prepare every block, then commit every block: all or nothing.

        The checks come in the documented order -- tokens (validated by the caller), then the parameter
        revisions of *every* block, then the session's free capacity -- so a full session with a stale
        later block reports the revision, not ``full`` (checking block by block would not: the mutant
        ``session_order_per_block`` of tests/mutants.py).
        """
        for block, cache in zip(self.model.blocks, self.caches):
            cache.check_binding(block)  # parameters may have been written in place since creation
        if self.length + len(tokens) > self.capacity:  # bindings first, then capacity, as in chapter 37
            raise CacheFull(self.capacity)
        window = self.model.window
        if self.prefill_within_window and window is not None and len(tokens) > window:  # a valid step, refused
            raise PrefillLongerThanWindow(len(tokens), window)
        hidden = self.model.embed(tokens, self.caches[0].next_position)  # [1, T, D]
        prepared: list[PreparedRows] = []
        for block, cache in zip(self.model.blocks, self.caches):
            rows = block.prepare(hidden, cache)
            hidden = hidden + np.tanh(rows.output)
            prepared.append(rows)
        logits: np.ndarray = self.model.logits(hidden)[0]  # [T, vocab]
        if not np.isfinite(logits).all():
            raise NonFiniteAttention("logits", int(np.argmin(np.isfinite(logits).ravel())), float("nan"))
        for cache, rows in zip(self.caches, prepared):  # nothing below can fail
            cache.commit(rows.keys, rows.values)
        return logits
