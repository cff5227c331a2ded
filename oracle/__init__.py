"""Slow, obviously correct ground truth: recomputes everything from the whole prefix.

Imports neither ``impl`` nor ``properties``.
"""

from .attention import AttentionTrace, ExactAttention, causal_attention, full_prefix_attention, rope_rotate, softmax
from .config import ROPE_STYLES, AttentionWeights, OracleInputError, RopeConfig, RopeStyle
from .decoder import (
    PRESETS,
    DecoderConfig,
    DecoderTrace,
    DecoderWeights,
    PositionConvention,
    full_decoder,
    greedy_generate,
    random_decoder_weights,
    sinusoid,
)
from .model_config import (
    ARCHITECTURES,
    MODEL_PRESETS,
    ContextConfig,
    LayerWeights,
    ModelBatch,
    ModelConfig,
    ModelWeights,
    gemma3_config,
    random_model_weights,
)
from .numbers import (
    COMPONENTS,
    FLOAT64,
    LOW_PRECISIONS,
    NumberSystem,
    mixed_precision,
    mpmath_precision,
    numpy_precision,
)
from .rounding import rounding_errors
from .storage import AFFINE_FORMATS, FLOAT_FORMATS, INTEGER_FORMATS, StorageFormat

__all__ = [
    "AFFINE_FORMATS",
    "ARCHITECTURES",
    "COMPONENTS",
    "FLOAT64",
    "FLOAT_FORMATS",
    "INTEGER_FORMATS",
    "LOW_PRECISIONS",
    "MODEL_PRESETS",
    "PRESETS",
    "ROPE_STYLES",
    "AttentionTrace",
    "AttentionWeights",
    "ContextConfig",
    "DecoderConfig",
    "DecoderTrace",
    "DecoderWeights",
    "ExactAttention",
    "LayerWeights",
    "ModelBatch",
    "ModelConfig",
    "ModelWeights",
    "NumberSystem",
    "OracleInputError",
    "PositionConvention",
    "RopeConfig",
    "RopeStyle",
    "StorageFormat",
    "causal_attention",
    "full_decoder",
    "full_prefix_attention",
    "gemma3_config",
    "greedy_generate",
    "mixed_precision",
    "mpmath_precision",
    "numpy_precision",
    "random_decoder_weights",
    "random_model_weights",
    "rope_rotate",
    "rounding_errors",
    "sinusoid",
    "softmax",
]
