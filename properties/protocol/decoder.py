"""The decoder half of an adapter: sessions and the prefix store (docs/spec.md §9-10).

Results may be any objects with the fields of ``StoreResult``, ``StoreEntry``
and ``BlockState``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..oracle import AttentionWeights, DecoderConfig, DecoderWeights
from .kinds import Capability


def longest_prefill(capabilities: frozenset[str], window: int | None) -> int | None:
    """The most tokens a session must take in one valid prefill (docs/spec.md §9.4): ``W`` where the adapter
    declares ``prefill_within_window`` and the decoder has a window (a longer one may be refused with ``refused``);
    otherwise no bound (None)."""
    return window if window is not None and Capability.PREFILL_WITHIN_WINDOW.value in capabilities else None


@dataclass(frozen=True, eq=False)
class BlockState:
    """One block's cache: rows held ``keys`` (rotated) and ``values`` ``[KV, n, dh]`` at ``positions [n]``."""

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


@dataclass(frozen=True, eq=False)
class StoreResult:
    """A store call: ``logits [len - cut, vocab]`` of the positions computed, what was reused, row counts."""

    logits: np.ndarray
    cut: int
    rows_computed: int  # blocks * 3 * (len(tokens) - cut)
    full_rows: int  # blocks * 3 * len(tokens)
    entry: int | None  # index in store_entries() (oldest first) of the entry reused; None if none


@dataclass(frozen=True, eq=False)
class StoreEntry:
    """A stored prefill, as copies: scope, tokens, per-block rows and ``next_position``."""

    scope: str
    tokens: tuple[int, ...]
    blocks: tuple[BlockState, ...]
    next_position: int


@runtime_checkable
class DecoderAdapter(Protocol):
    """The decoder half of an adapter (capabilities ``decode_session`` / ``prefix_store``).

    Token sequences are handed over exactly as the suite built them -- valid
    or not (``[1.0, 2]``, ``[True]``, ``[]``) -- and must be rejected with
    ``invalid_tokens`` when invalid. Results may be any objects with the fields
    of ``StoreResult``, ``StoreEntry`` and ``BlockState``.
    """

    def create_decoder(self, config: DecoderConfig, weights: DecoderWeights) -> Any:
        """A new decoder owning new parameters with these values."""

    def update_block_weights(self, decoder: Any, block: int, weights: AttentionWeights) -> None:
        """Write new values into block ``block``'s four parameters in place (one layer's optimiser step)."""

    def create_session(self, decoder: Any, capacity: int) -> Any:
        """A decode session of at most ``capacity`` tokens, one cache per block."""

    def prefill(self, session: Any, tokens: Any) -> np.ndarray:
        """Process tokens in one step; logits ``[T, vocab]`` of their positions."""

    def decode(self, session: Any, token: Any) -> np.ndarray:
        """Process one token; logits ``[vocab]``."""

    def reset_session(self, session: Any) -> None:
        """Empty every block's cache."""

    def session_state(self, session: Any) -> tuple[BlockState, ...]:
        """Copies of every block's cache, and nothing else."""

    def create_store(self, capacity: int) -> Any:
        """An empty prefix store keeping at most ``capacity`` entries."""

    def store_prefill(self, store: Any, decoder: Any, scope: str, tokens: Any) -> StoreResult:
        """Compute ``tokens`` and store them (evicting the oldest entry when full); computing from scratch
        or first reusing a stored prefix by the query's rules are both conforming (docs/spec.md §10.7)."""

    def store_query(self, store: Any, decoder: Any, scope: str, tokens: Any) -> StoreResult:
        """Compute ``tokens`` reusing the longest usable stored prefix; store nothing."""

    def store_entries(self, store: Any) -> list[StoreEntry]:
        """Copies of the entries, oldest first."""
