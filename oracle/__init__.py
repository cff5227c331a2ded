"""Slow, obviously correct ground truth: recomputes everything from the whole prefix.

Imports neither ``impl`` nor ``properties``.
"""

from .attention import AttentionTrace, full_prefix_attention, rope_rotate, softmax
from .config import ROPE_STYLES, AttentionWeights, OracleInputError, RopeConfig, RopeStyle
from .numbers import FLOAT64, NumberSystem, mpmath_precision

__all__ = [
    "FLOAT64",
    "ROPE_STYLES",
    "AttentionTrace",
    "AttentionWeights",
    "NumberSystem",
    "OracleInputError",
    "RopeConfig",
    "RopeStyle",
    "full_prefix_attention",
    "mpmath_precision",
    "rope_rotate",
    "softmax",
]
