"""The adapter protocol: the only way the suite reaches an implementation.

An adapter is any object with the attributes and methods its capabilities
call for (structural typing: nothing to import or subclass). Error kinds and
capabilities are plain strings. The parts:

- ``kinds``: ``ErrorKind``, ``Capability``, and which claim judges which kind;
- ``layer``: ``KvCacheAdapter``, ``CacheOperations``, ``RaggedBatches`` and ``LayeredCaches``, with ``CacheSnapshot``,
  ``RowSnapshot`` and ``LayerState``;
- ``decoder``: ``DecoderAdapter`` (sessions and the prefix store);
- ``paged``: ``PagedCacheAdapter`` and its declared ``PagedPolicy``;
- ``model``: ``ModelAdapter`` (whole models over sequences), its ``ModelPolicy`` and ``ModelLimits``;
- ``declarations``: the methods a declaration obliges, ``layer_limits``,
  the precision and storage declarations, and what contradicts what;
- ``isolation``: ``isolated``, an adapter running another in a child process.

See docs/adapters.md for a minimal complete example.
"""

from ..oracle import AttentionWeights, DecoderConfig, DecoderWeights, RopeConfig
from .declarations import METHODS_OF, LayerLimits, required_methods
from .decoder import BlockState, DecoderAdapter, StoreEntry, StoreResult
from .kinds import CLAIMED_BY, LAYER_CONVENTIONS, VALIDATIONS, Capability, ErrorKind, declared
from .layer import (
    CacheOperations,
    CacheSnapshot,
    KvCacheAdapter,
    LayeredCaches,
    LayerState,
    RaggedBatches,
    RowSnapshot,
)
from .model import (
    ContextConfig,
    LayerWeights,
    ModelAdapter,
    ModelBatch,
    ModelConfig,
    ModelLimits,
    ModelPolicy,
    ModelPolicyError,
    ModelWeights,
)
from .paged import PagedAdd, PagedCacheAdapter, PagedPolicy, PolicyError, PoolState

__all__ = ["CLAIMED_BY", "LAYER_CONVENTIONS", "METHODS_OF", "VALIDATIONS", "AttentionWeights", "BlockState",
           "CacheOperations", "CacheSnapshot", "Capability", "ContextConfig", "DecoderAdapter", "DecoderConfig",
           "DecoderWeights", "ErrorKind", "KvCacheAdapter", "LayerLimits", "LayerState",
           "LayerWeights", "LayeredCaches", "ModelAdapter",
           "ModelBatch", "ModelConfig", "ModelLimits", "ModelPolicy", "ModelPolicyError", "ModelWeights", "PagedAdd",
           "PagedCacheAdapter", "PagedPolicy", "PolicyError", "PoolState", "RaggedBatches", "RopeConfig", "RowSnapshot",
           "StoreEntry", "StoreResult",
           "declared", "required_methods"]
