"""Whole models that conform by other means than the reference, for replay's portability (issue 36).

``AcceptsWhatItDoesNotClaim`` claims neither batch validation, sequence-operation validation nor a fixed
capacity, and accepts every such input as docs/spec.md §5.5 allows: a token outside the vocabulary is clamped
into it, a sequence id outside the context wraps, positions are renumbered to follow each sequence's last, an
operation on an unknown sequence (or a divide by 0) does nothing, and a context with no room grows.
``RoundsCellsUp`` claims what the reference claims, but gives each store of a context more cells than asked
(llama.cpp pads ``n_ctx``; docs/spec.md §15.2 allows rounding up), and reports them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from impl.errors import ContextFull
from impl.model import ModelContext
from impl.model_conformance import ModelReferenceAdapter

UNCLAIMED = frozenset({"validates_model_batch", "validates_sequence_ops", "fixed_capacity"})
ROUNDING = 16  # cells per store, rounded up to a multiple of this


class LenientContext(ModelContext):
    """The reference's context repairing a malformed batch instead of refusing it, and growing when full."""

    def _checked_batch(self, tokens: Any, positions: Any, sequences: Any) -> tuple[np.ndarray, ...]:
        s = self.model.shape
        tokens = [min(max(int(t), 0), s.vocab - 1) for t in tokens]
        sequences = [int(q) % self.sequences for q in sequences]
        following: dict[int, int] = {}
        renumbered = []
        for position, seq in zip(positions, sequences):
            if seq not in following:
                last = self.pos_max(seq)
                following[seq] = last + 1 if last >= 0 else min(max(int(position), 0), s.max_positions - 1)
            renumbered.append(min(following[seq], s.max_positions - 1))
            following[seq] += 1
        return super()._checked_batch(tokens, renumbered, sequences)

    def grow(self, cells: int) -> None:
        """``cells`` more cells in every store (empty: free)."""
        def padded(array: np.ndarray, axis: int, fill: Any) -> np.ndarray:
            shape = list(array.shape)
            shape[axis] = cells
            return np.concatenate([array, np.full(shape, fill, dtype=array.dtype)], axis=axis)

        self.keys, self.values = padded(self.keys, 2, 0), padded(self.values, 2, 0)
        self.positions, self.tokens = padded(self.positions, 1, -1), padded(self.tokens, 1, -1)
        self.members = padded(self.members, 1, False)
        self.capacity += cells


class AcceptsWhatItDoesNotClaim(ModelReferenceAdapter):
    name = "accepts-what-it-does-not-claim"
    capabilities = ModelReferenceAdapter.capabilities - UNCLAIMED

    def create_context(self, model: Any, config: Any) -> ModelContext:
        return LenientContext(model, config.cells, config.max_sequences, config.unified,
                              shared_copies=self.model_policy.get("shared_copies", True),
                              copy_into_nonempty=self.model_policy.get(
                                  "copy_unified" if config.unified else "copy_per_sequence", "merge"))

    def _known(self, context: ModelContext, *sequences: Any, any_allowed: bool = False) -> bool:
        return all(isinstance(seq, int) and seq < context.sequences and (seq >= 0 or any_allowed)
                   for seq in sequences)

    @staticmethod
    def _with_room(context: Any, action: Any) -> Any:
        while True:
            try:
                return action()
            except ContextFull:  # all or nothing: nothing was written
                context.grow(max(context.capacity, 1))

    def decode_batch(self, context: ModelContext, batch: Any) -> np.ndarray:
        return self._with_room(context, lambda: super(AcceptsWhatItDoesNotClaim, self).decode_batch(context, batch))

    def seq_remove(self, context: ModelContext, seq: int, p0: int, p1: int) -> None:
        if self._known(context, seq, any_allowed=True):
            super().seq_remove(context, seq, p0, p1)

    def seq_copy(self, context: ModelContext, src: int, dst: int, p0: int, p1: int) -> None:
        if self._known(context, src, dst):
            self._with_room(context, lambda: super(AcceptsWhatItDoesNotClaim, self).seq_copy(context, src, dst, p0,
                                                                                              p1))

    def seq_keep(self, context: ModelContext, seq: int) -> None:
        if self._known(context, seq):
            super().seq_keep(context, seq)

    def seq_shift(self, context: ModelContext, seq: int, p0: int, p1: int, delta: int) -> None:
        if self._known(context, seq):
            super().seq_shift(context, seq, p0, p1, delta)

    def seq_divide(self, context: ModelContext, seq: int, p0: int, p1: int, d: int) -> None:
        if self._known(context, seq) and d >= 1:
            super().seq_divide(context, seq, p0, p1, d)

    def load_sequence(self, context: ModelContext, seq: int, state: Any) -> None:
        if self._known(context, seq):
            self._with_room(context, lambda: super(AcceptsWhatItDoesNotClaim, self).load_sequence(context, seq, state))


class RoundsCellsUp(ModelReferenceAdapter):
    name = "rounds-cells-up"

    def create_context(self, model: Any, config: Any) -> ModelContext:
        rounded = -(-config.stream_cells // ROUNDING) * ROUNDING
        cells = rounded if config.unified else rounded * config.max_sequences
        return super().create_context(model, dataclasses.replace(config, cells=cells))


class ReportsTheCellsAskedFor(RoundsCellsUp):
    """Rounds up, but reports the cells asked for: a batch past that room is accepted (the twin that must fail)."""

    name = "reports-the-cells-asked-for"

    def context_cells(self, context: ModelContext) -> int:
        return int(context.cells_asked)  # type: ignore[attr-defined]

    def create_context(self, model: Any, config: Any) -> ModelContext:
        context = super().create_context(model, config)
        context.cells_asked = config.stream_cells  # type: ignore[attr-defined]
        return context


def make_accepting_model_adapter() -> AcceptsWhatItDoesNotClaim:
    return AcceptsWhatItDoesNotClaim()


def make_rounding_model_adapter() -> RoundsCellsUp:
    return RoundsCellsUp()

