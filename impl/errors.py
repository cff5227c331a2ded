"""Typed errors of the layer-bound KV cache: one class per kind, one base class.

Every error carries the offending values as attributes, and its message says
what was wrong and what to do. Every rejection happens before a cache is
changed, so catching one never leaves a half-written cache behind.
"""

from __future__ import annotations


class KvCacheError(Exception):
    """Base class of every error this package raises on purpose."""


# -- configuration of a layer or its RoPE -------------------------------------------------------

class InvalidLayerConfig(KvCacheError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"invalid attention layer: {problem}; build the layer from consistent shapes")


class InvalidRopeConfig(KvCacheError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"invalid RoPE configuration: {problem}")


class RopePositionOutOfRange(KvCacheError):
    def __init__(self, position: int, max_positions: int) -> None:
        self.position, self.max_positions = position, max_positions
        super().__init__(f"RoPE position {position} is outside [0, {max_positions}); "
                         "raise max_positions when building the layer")


# -- cache creation -------------------------------------------------------------------------------

class InvalidCacheArgument(KvCacheError):
    def __init__(self, name: str, value: object) -> None:
        self.name, self.value = name, value
        super().__init__(f"KV cache {name} must be a non-negative int, got {value!r}")


class ZeroBatchSize(KvCacheError):
    def __init__(self) -> None:
        super().__init__("KV cache batch size must be at least 1")


class ZeroCapacity(KvCacheError):
    def __init__(self) -> None:
        super().__init__("KV cache capacity must be at least 1")


class CapacityExceedsPositions(KvCacheError):
    def __init__(self, capacity: int, max_positions: int) -> None:
        self.capacity, self.max_positions = capacity, max_positions
        super().__init__(f"KV cache capacity {capacity} exceeds the RoPE position capacity "
                         f"{max_positions}; lower the capacity or raise max_positions")


class ElementCountOverflow(KvCacheError):
    def __init__(self, batch_size: int, kv_heads: int, capacity: int, head_width: int) -> None:
        self.batch_size, self.kv_heads = batch_size, kv_heads
        self.capacity, self.head_width = capacity, head_width
        super().__init__(f"KV cache of batch {batch_size}, {kv_heads} kv heads, capacity {capacity} "
                         f"and head width {head_width} has more bytes than an array can index; "
                         "use a smaller batch or capacity")


class AllocationFailed(KvCacheError):
    def __init__(self, elements: int) -> None:
        self.elements = elements
        super().__init__(f"cannot allocate KV cache storage for {elements} float64 values "
                         f"({elements * 8 / 2**30:.3g} GiB per buffer); use a smaller batch or capacity")


# -- the new input row ----------------------------------------------------------------------------

class InputDtypeError(KvCacheError):
    def __init__(self, actual: str) -> None:
        self.actual = actual
        super().__init__(f"incremental attention input must be a float64 numpy array, got {actual}; "
                         "convert it with np.asarray(x, dtype=np.float64)")


class InputRankError(KvCacheError):
    def __init__(self, rank: int) -> None:
        self.rank = rank
        super().__init__(f"incremental attention input must have rank 3 [batch, 1, model_width], "
                         f"got rank {rank}")


class TokenCountError(KvCacheError):
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        super().__init__(f"a step takes exactly one new token and a chunk at least one, got {tokens}; "
                         "feed a prompt one row at a time, or as a chunk")


class InputBatchMismatch(KvCacheError):
    def __init__(self, cache: int, input: int) -> None:
        self.cache, self.input = cache, input
        super().__init__(f"input batch {input} must match the cache batch {cache}")


class InputWidthMismatch(KvCacheError):
    def __init__(self, expected: int, actual: int) -> None:
        self.expected, self.actual = expected, actual
        super().__init__(f"input width must equal the model width {expected}, got {actual}")


class InvalidTokens(KvCacheError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"invalid token ids: {problem}; pass a non-empty list or 1-D integer array of "
                         "ids in [0, vocab)")


class InvalidStoreArgument(KvCacheError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"invalid prefix-store argument: {problem}")


# -- the layer/cache binding ----------------------------------------------------------------------

class CacheGeometryMismatch(KvCacheError):
    """The cache was built for a layer of another shape."""

    what = "geometry"

    def __init__(self, layer: int, cache: int) -> None:
        self.layer, self.cache = layer, cache
        super().__init__(f"KV cache {self.what} {cache} must match the attention layer's {layer}; "
                         "build the cache from this layer")


class CacheModelWidthMismatch(CacheGeometryMismatch):
    what = "model width"


class CacheHeadCountMismatch(CacheGeometryMismatch):
    what = "query head count"


class CacheKvHeadCountMismatch(CacheGeometryMismatch):
    what = "kv head count"


class CacheHeadWidthMismatch(CacheGeometryMismatch):
    what = "head width"


class CacheLayerMismatch(KvCacheError):
    def __init__(self, parameter: int) -> None:
        self.parameter = parameter
        super().__init__(f"KV cache parameter identity does not match this attention layer "
                         f"(parameter {parameter}); a recreated layer needs a new cache")


class CacheLayerRevisionMismatch(KvCacheError):
    def __init__(self, parameter: int, cache: int, layer: int) -> None:
        self.parameter, self.cache, self.layer = parameter, cache, layer
        super().__init__(f"KV cache was built at revision {cache} of parameter {parameter}, the layer "
                         f"is at revision {layer}; its rows are stale, create a new cache "
                         "(reset does not refresh it)")


class CacheRopeMismatch(KvCacheError):
    def __init__(self, cache: object, layer: object) -> None:
        self.cache, self.layer = cache, layer
        super().__init__(f"KV cache RoPE configuration {cache} does not match the layer's {layer} "
                         "(the base is compared bit for bit); build the cache from this layer")


# -- capacity and values --------------------------------------------------------------------------

class CacheFull(KvCacheError):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        super().__init__(f"KV cache is full at capacity {capacity}; reset it or create a larger one")


class NonFiniteError(KvCacheError):
    """A value that must be finite is not; nothing was written."""

    def __init__(self, what: str, index: int, value: float) -> None:
        self.what, self.index, self.value = what, index, value
        super().__init__(f"{what} at flat index {index} must be finite, got {value!r}; "
                         "nothing was written to the cache")


class NonFiniteInput(NonFiniteError):
    pass


class NonFiniteKeyValue(NonFiniteError):
    """The projected key or value row overflowed."""


class NonFiniteAttention(NonFiniteError):
    """The query, the scores or the output overflowed."""


# -- cache operations: truncate, reorder --------------------------------------------------------------

class InvalidLength(KvCacheError):
    def __init__(self, value: object, length: int) -> None:
        self.value, self.length = value, length
        super().__init__(f"truncate: the length to keep must be an int in [0, {length}] (the current length), "
                         f"got {value!r}")


class RowsEvicted(KvCacheError):
    def __init__(self, length: int, needed: int, oldest: int) -> None:
        self.length, self.needed, self.oldest = length, needed, oldest
        super().__init__(f"truncate to {length}: the next row would attend to position {needed}, but the sliding "
                         f"window keeps rows from position {oldest} only; evicted rows cannot come back")


class InvalidIndices(KvCacheError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"reorder: {problem}; pass one int index in [0, batch size) per batch row")


# -- whole models: a context's cells and its sequence operations (impl.model) ----------------------------------

class InvalidModelConfig(KvCacheError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"invalid model or context: {problem}")


class ContextFull(KvCacheError):
    def __init__(self, needed: int, free: int, what: str) -> None:
        self.needed, self.free = needed, free
        super().__init__(f"{what} needs {needed} cells but the store has {free} free; remove cells of a sequence "
                         "or create the context with more cells")


class MalformedBatch(KvCacheError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"malformed batch: {problem}; tokens must be ids in [0, vocab), sequences ids of the "
                         "context, and each sequence's positions must run on from its last by one")


class SequenceOperationRefused(KvCacheError):
    def __init__(self, operation: str, problem: str) -> None:
        self.operation, self.problem = operation, problem
        super().__init__(f"{operation}: {problem}")


class PrefillLongerThanWindow(KvCacheError):
    def __init__(self, tokens: int, window: int) -> None:
        self.tokens, self.window = tokens, window
        super().__init__(f"a prefill of {tokens} tokens is longer than the window of {window}; "
                         f"prefill in chunks of at most {window} tokens")


class InvalidRowLengths(InvalidLength):
    """A ragged append's lengths: not one int per batch row, each in ``[0, T]`` (docs/spec.md §13.8)."""

    def __init__(self, value: object, batch_size: int, tokens: int) -> None:
        KvCacheError.__init__(self, f"append_ragged: the lengths must be {batch_size} ints in [0, {tokens}] "
                                    f"(one per batch row), got {value!r}")
        self.value, self.length = value, tokens

