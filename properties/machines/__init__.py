"""The conformance machines, one module each, and the registry by which traces name them.

- ``layer``: a layer-bound cache, one row at a time (its rules: ``layer_steps``);
- ``operations``: the same steps with chunks, truncation, reorders, forks and windows;
- ``batches``: ragged batches (rows at their own offsets) that merge and split;
- ``layered``: the caches of a model's layers, operated at once (a layer never written included);
- ``session``: a decoder's decode session;
- ``store``: the longest-common-prefix store;
- ``paged``: a paged pool sharing blocks between sequences (its rules, stated independently: ``paged_rules``);
- ``model``: a whole model's batches and sequence operations, against the oracle's cell model.

``base`` is the machine side of the judging core, and the helpers the decoder
machines share; ``layer_model`` what a layer cache must hold. A machine never
imports another.
"""

from __future__ import annotations

from ..traces.recording import TracedMachine
from .batches import BatchesMachine
from .layer import LayerCacheMachine
from .layered import LayeredCacheMachine
from .model import ModelMachine
from .operations import CacheOperationsMachine
from .paged import PagedCacheMachine
from .session import SessionMachine
from .store import PrefixStoreMachine

# The machines a trace may name (a trace never names a module: it cannot make replay import code).
MACHINES: dict[str, type[TracedMachine]] = {
    "layer_cache": LayerCacheMachine, "session": SessionMachine, "prefix_store": PrefixStoreMachine,
    "cache_operations": CacheOperationsMachine, "paged": PagedCacheMachine, "model": ModelMachine,
    "batches": BatchesMachine, "layered_cache": LayeredCacheMachine,
}

__all__ = ["MACHINES", "BatchesMachine", "CacheOperationsMachine", "LayerCacheMachine", "LayeredCacheMachine",
           "ModelMachine",
           "PagedCacheMachine", "PrefixStoreMachine", "SessionMachine"]
