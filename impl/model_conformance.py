"""The reference whole model for the conformance suite (capability ``whole_model``, docs/spec.md §15).

``ModelReferenceAdapter`` drives ``impl.model`` through the model protocol's methods (by their names:
``impl`` imports no protocol); ``make_model_adapter`` builds it. Its policy is llama.cpp's unified
reading: copies share cells in a unified context and merge into a non-empty destination.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from . import errors
from .model import LlamaModel, ModelContext, SequenceState

MODEL_ERROR_KINDS: dict[type[errors.KvCacheError], str] = {
    errors.ContextFull: "full",
    errors.MalformedBatch: "malformed_batch",
    errors.SequenceOperationRefused: "refused",
}


class ModelReferenceAdapter:
    name = "kvcache-reference-model"
    version = "1"
    capabilities = frozenset({"whole_model", "float64", "gqa", "rope_interleaved", "rope_half_split",
                              "sliding_window", "fixed_capacity", "seq_remove", "seq_copy", "seq_keep", "seq_shift",
                              "seq_divide", "seq_state", "validates_model_batch", "validates_sequence_ops"})
    model_policy: ClassVar[dict[str, Any]] = {"contexts": ["unified", "per_sequence"], "shared_copies": True,
                                              "copy_unified": "merge", "copy_per_sequence": "merge"}

    def create_model(self, config: Any, weights: Any) -> LlamaModel:
        return LlamaModel(config, weights)

    def create_context(self, model: LlamaModel, config: Any) -> ModelContext:
        copy = self.model_policy["copy_unified" if config.unified else "copy_per_sequence"]
        return ModelContext(model, config.cells, config.max_sequences, config.unified,
                            shared_copies=self.model_policy["shared_copies"], copy_into_nonempty=copy)

    def context_cells(self, context: ModelContext) -> int:
        return context.capacity

    def decode_batch(self, context: ModelContext, batch: Any) -> np.ndarray:
        return context.decode(batch.tokens, batch.positions, batch.sequences, batch.logits)

    def clear(self, context: ModelContext) -> None:
        context.clear()

    def seq_pos_min(self, context: ModelContext, seq: int) -> int:
        return context.pos_min(seq)

    def seq_pos_max(self, context: ModelContext, seq: int) -> int:
        return context.pos_max(seq)

    def can_shift(self, context: ModelContext) -> bool:
        return True

    def seq_remove(self, context: ModelContext, seq: int, p0: int, p1: int) -> None:
        context.remove(seq, p0, p1)

    def seq_copy(self, context: ModelContext, src: int, dst: int, p0: int, p1: int) -> None:
        context.copy(src, dst, p0, p1)

    def seq_keep(self, context: ModelContext, seq: int) -> None:
        context.keep(seq)

    def seq_shift(self, context: ModelContext, seq: int, p0: int, p1: int, delta: int) -> None:
        context.shift(seq, p0, p1, delta)

    def seq_divide(self, context: ModelContext, seq: int, p0: int, p1: int, d: int) -> None:
        context.divide(seq, p0, p1, d)

    def save_sequence(self, context: ModelContext, seq: int) -> SequenceState:
        return context.save(seq)

    def load_sequence(self, context: ModelContext, seq: int, state: Any) -> None:
        context.load(seq, state)

    def error_kind(self, error: BaseException) -> str | None:
        for error_type, kind in MODEL_ERROR_KINDS.items():
            if isinstance(error, error_type):
                return kind
        return None


def make_model_adapter() -> ModelReferenceAdapter:
    return ModelReferenceAdapter()
