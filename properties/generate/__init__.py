"""What the machines draw: every Hypothesis strategy of the suite, with its documented bounds (docs/spec.md §8.1).

- ``layers``: layer geometries, weights, RoPE configurations and cache shapes,
  only within the adapter's declarations and ``layer_limits``;
- ``inputs``: valid rows and chunks in every memory layout, malformed ones;
- ``extremes``: overflowing and peaked rows, outside the ranges on purpose;
- ``arguments``: truncation lengths and batch indices, valid or not;
- ``decoders``: decoders, token sequences and block updates;
- ``layouts``: the memory layouts of a valid row.
"""

from .arguments import Argument, batch_indices, indices_problem, length_problem, truncation_lengths
from .decoders import (
    MAX_BLOCKS,
    MAX_SEQUENCE,
    MAX_VOCAB,
    block_update,
    block_updates,
    decoder_configs,
    invalid_token_sequences,
    paged_decoder_configs,
    token_lists,
)
from .extremes import (
    FLOAT64_MAX,
    PEAK_MAX_INPUT,
    PEAK_SCORE,
    isolated_overflows,
    output_overflows,
    overflow_targets,
    overflowing_row,
    peak_features,
    score_overflows,
)
from .inputs import INPUT_CHECKS, MAX_CHUNK, MalformedRow, chunks, layouts, malformed_rows, rows
from .layers import (
    INPUT_BOUND,
    MAX_BATCH,
    MAX_CAPACITY,
    MAX_HEAD_WIDTH,
    MAX_HEADS,
    MAX_MODEL_WIDTH,
    NO_LIMITS,
    NO_ROPE_POSITIONS,
    TOLERANCE,
    WEIGHT_BOUND,
    LayerConfig,
    attention_weights,
    bounded_arrays,
    layer_configs,
    position_styles,
    requirements_of,
    rope_bases,
    rope_configs,
    seeded_arrays,
    weight_updates,
)
from .layouts import ORDERS, layout_of, same_layout_copy, with_layout

__all__ = [
    "FLOAT64_MAX", "INPUT_BOUND", "INPUT_CHECKS", "MAX_BATCH", "MAX_BLOCKS", "MAX_CAPACITY", "MAX_CHUNK",
    "MAX_HEADS", "MAX_HEAD_WIDTH", "MAX_MODEL_WIDTH", "MAX_SEQUENCE", "MAX_VOCAB", "NO_LIMITS",
    "NO_ROPE_POSITIONS", "ORDERS", "PEAK_MAX_INPUT", "PEAK_SCORE", "TOLERANCE", "WEIGHT_BOUND", "Argument",
    "LayerConfig", "MalformedRow", "attention_weights", "batch_indices", "block_update", "block_updates",
    "bounded_arrays", "chunks", "decoder_configs", "indices_problem", "invalid_token_sequences",
    "isolated_overflows", "layer_configs", "layout_of", "layouts", "length_problem", "malformed_rows",
    "output_overflows", "overflow_targets", "overflowing_row", "paged_decoder_configs", "peak_features",
    "position_styles", "requirements_of", "rope_bases", "rope_configs", "rows", "same_layout_copy",
    "score_overflows", "seeded_arrays", "token_lists", "truncation_lengths", "weight_updates", "with_layout",
]
