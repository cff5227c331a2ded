"""The reference implementation: a fixed-capacity, layer-bound KV cache (docs/spec.md §4).

Imports neither ``oracle`` nor ``properties``; the suite reaches it only
through ``impl.conformance:make_adapter``.
"""

from . import errors
from .attention import AttentionLayer
from .cache import LayerKvCache
from .decoder import Decoder, DecodeSession
from .parameters import AdamW, Parameter
from .rope import RopeConfig

__version__ = "0.1.0"

__all__ = ["AdamW", "AttentionLayer", "DecodeSession", "Decoder", "LayerKvCache", "Parameter", "RopeConfig", "errors"]
