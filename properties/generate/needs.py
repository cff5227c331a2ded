"""What a property, a machine or a trace needs of an adapter to apply -- like test262's ``features`` -- and the
one gate that decides it.

A property or trace that does not apply is skipped with the reason, never
failed: the gate is asked before anything is drawn (``PropertyRun``) and
before a trace is replayed (``traces.replay``), and generators draw only
within the declarations, so what passed the gate never meets an
``Unsatisfiable``, an ``AttributeError`` or a "declares no ...".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..protocol.declarations import (
    LAYER_METHODS,
    LayerLimits,
    declared_dtype,
    declared_precision,
    declared_storage,
    drives_layer_caches,
)
from ..protocol.kinds import Capability, declared
from ..protocol.model import ModelPolicy
from ..protocol.paged import PagedPolicy
from .layers import layer_families

Alternatives = tuple[frozenset[str], ...]  # one of these sets of capabilities, all of the set

# the storage scales under which a row's stored values are a function of its own tokens alone (docs/spec.md §13.8)
ROW_OWN_SCALES = ("none", "per_group")


def one_of(*alternatives: Iterable[Any]) -> Alternatives:
    return tuple(frozenset(str(getattr(c, "value", c)) for c in group) for group in alternatives)


# The layer conventions (docs/spec.md §3) and the decoders' position conventions (§2.4): a RoPE decoder needs
# the pairing it is drawn with.
LAYER_CONVENTION = one_of([Capability.ROPE_INTERLEAVED], [Capability.ROPE_HALF_SPLIT], [Capability.POSITIONLESS])
ROPE_PAIRING = one_of([Capability.ROPE_INTERLEAVED], [Capability.ROPE_HALF_SPLIT])
DECODER_POSITIONS = one_of([Capability.POSITIONS_SINUSOIDAL],
                           [Capability.POSITIONS_ROPE, Capability.ROPE_INTERLEAVED],
                           [Capability.POSITIONS_ROPE, Capability.ROPE_HALF_SPLIT])


class UnknownDeclaration(ValueError):
    """A declaration name no entry of ``DECLARATIONS`` reads (a rule's ``relies_on``, or a trace of a newer suite)."""


@dataclass(frozen=True)
class Declaration:
    """A declaration besides capabilities that what a machine draws may depend on: how to read it from an adapter
    (a JSON value, the one a trace records), and which declared values admit a program drawn under another."""

    read: Callable[[Any], Any]
    admits: Callable[[Any, Any], bool] = lambda recorded, declared: recorded == declared  # (recorded, here)


def _storage(adapter: Any) -> dict[str, Any] | None:
    storage = declared_storage(adapter)
    return None if storage is None else asdict(storage)


# By the names the guide gives them (docs/adapters.md). Only what shapes the draws or decides whether a rule may
# run is here: what only shapes the expectations (a hit limit, the eviction, duplicates, the scope in the hash)
# is recomputed under the replaying adapter's declaration, and judged there.
DECLARATIONS: dict[str, Declaration] = {
    # one decoder per pool without "signature": a program of two mixes weights the pool is promised never to see
    "paged_policy.hash_keys signature": Declaration(lambda a: "signature" in PagedPolicy.of(a).hash_keys),
    # a value drawn per declared request key; a program that drew none is valid under any (each "" then)
    "paged_policy.request_keys": Declaration(lambda a: list(PagedPolicy.of(a).request_keys),
                                             lambda recorded, here: not recorded or recorded == here),
    "paged_policy.truncate": Declaration(lambda a: PagedPolicy.of(a).truncate),
    # the rule that sets up a cached and an in-use copy of one block runs only where duplicates are registered
    "paged_policy.duplicates": Declaration(lambda a: PagedPolicy.of(a).duplicates),
    # a program that forks runs under any fork but "none" (each judged as its pool declares)
    "paged_policy.fork": Declaration(lambda a: PagedPolicy.of(a).fork,
                                     lambda recorded, here: recorded == here or "none" not in (recorded, here)),
    # a whole-only copy draws no range (the copy rule draws one only where ranges may be copied)
    "model_policy.copy_unified whole_only": Declaration(lambda a: ModelPolicy.of(a).copy_unified == "whole_only"),
    "model_policy.copy_per_sequence whole_only": Declaration(
        lambda a: ModelPolicy.of(a).copy_per_sequence == "whole_only"),
    # a program that never shifted a cell below 0 is valid where such a shift removes it
    "model_policy.negative_shift": Declaration(lambda a: ModelPolicy.of(a).negative_shift,
                                               lambda recorded, here: recorded in (here, "not_drawn")),
    # every empty sequence started at 0, no batch drawn whose positions do not run on: a program drawn so is one
    # an engine taking the caller's positions can be handed too, not the other way round
    "model_policy.positions": Declaration(lambda a: ModelPolicy.of(a).positions,
                                          lambda recorded, here: recorded in (here, "from_zero")),
    # room judged against context_cells, or none: the chains that fill a store draw otherwise
    "model_policy.capacity": Declaration(lambda a: ModelPolicy.of(a).capacity),
    # a store that evicts draws windowed models more often
    "model_policy.window_cells": Declaration(lambda a: ModelPolicy.of(a).window_cells),
    "dtype": Declaration(declared_dtype),
    "mixed_precision": Declaration(lambda a: declared_precision(a)[1]),
    "storage": Declaration(_storage),
}


# What a replayed run observes of the adapter that the recorded run's draws depended on (a trace records it as
# observed): where the replaying adapter shows another value, the recorded program is not the one drawn here.
OBSERVATIONS: dict[str, Callable[[Any, Any], bool]] = {
    # room is judged against the cells a store reports (docs/spec.md §15.2): a batch past the room of one count
    # is within another's
    "context cells": lambda recorded, here: recorded == here,
}


def observation_problem(name: str, recorded: Any, here: Any, adapter: Any) -> str | None:
    """Why a replay that observes ``here`` where the recorded run observed ``recorded`` does not apply (None: it
    does)."""
    admits = OBSERVATIONS.get(name)
    if admits is None:
        raise UnknownDeclaration(f"no observation {name!r}; the suite records {', '.join(sorted(OBSERVATIONS))}")
    if admits(recorded, here):
        return None
    return (f"{getattr(adapter, 'name', 'the adapter')} shows {name} {here!r}, but the trace was recorded against "
            f"{recorded!r}, and its draws depend on it")


def declaration(name: str) -> Declaration:
    found = DECLARATIONS.get(name)
    if found is None:
        raise UnknownDeclaration(f"no declaration {name!r}; the suite reads {', '.join(sorted(DECLARATIONS))}")
    return found


def declared_values(adapter: Any, names: Iterable[str]) -> dict[str, Any]:
    """What ``adapter`` declares of each of ``names`` (JSON values: a trace records them)."""
    return {name: declaration(name).read(adapter) for name in sorted(names)}


@dataclass(frozen=True)
class Needs:
    """Capabilities all of which, and groups of alternatives one of each of which, an adapter must declare; and
    for the layer machines, the layer families its ``layer_limits`` must leave at least one geometry of."""

    capabilities: frozenset[str] = frozenset()
    alternatives: tuple[Alternatives, ...] = ()
    layer_caches: bool = False  # the adapter must drive layer caches (have the layer-cache methods)
    families: tuple[tuple[str | None, bool | None], ...] | None = None  # (style, grouped); None: any
    why: dict[str, str] = field(default_factory=dict, compare=False)  # what an alternatives group stands for
    # (name, value recorded, what relied on it): a trace's program was drawn under these declarations
    declarations: tuple[tuple[str, Any, str], ...] = ()
    # (capability, claimed, what relied on it): a trace's later steps were drawn after a call was rejected under
    # the claim (claimed), or accepted without it and its object replaced (not claimed)
    claims: tuple[tuple[str, bool, str], ...] = ()
    # what is judged under a declared storage only where its scales are each row's own (ragged batches, docs/spec.md
    # §13.8: scale none or per_group): the reason a scale over the whole batch is not judged
    unstored: str | None = None

    @classmethod
    def of(cls, *capabilities: Any, alternatives: Iterable[tuple[str, Alternatives]] = (),
           families: tuple[tuple[str | None, bool | None], ...] | None = None, layer_caches: bool = False) -> Needs:
        named = list(alternatives)
        return cls(frozenset(str(getattr(c, "value", c)) for c in capabilities), tuple(a for _, a in named),
                   layer_caches or families is not None, families, {str(i): name for i, (name, _) in enumerate(named)})

    @classmethod
    def drawn_under(cls, recorded: Mapping[str, Any], claims: Mapping[str, Any] | None = None) -> Needs:
        """A trace's program, drawn under ``recorded`` declarations (its ``declarations``: name -> {"value",
        "relied_on_by"}) and ``claims`` (capability -> {"value": claimed, "relied_on_by"}): applicable where the
        adapter's declarations admit it and it claims what the later steps relied on being claimed, and nothing
        they relied on being unclaimed. UnknownDeclaration for a name this suite does not read."""
        kept, claimed = [], []
        for name, entry in sorted(recorded.items()):
            declaration(name)
            kept.append((name, _value(name, entry), ", ".join(entry.get("relied_on_by", ())) or "the program"))
        for capability, entry in sorted((claims or {}).items()):
            if not isinstance(_value(capability, entry), bool):
                raise UnknownDeclaration(f"claim {capability!r}: its value must be true or false, got {entry!r}")
            claimed.append((capability, entry["value"], ", ".join(entry.get("relied_on_by", ())) or "the program"))
        return cls(declarations=tuple(kept), claims=tuple(claimed))

    def problem(self, adapter: Any) -> str | None:
        """Why ``adapter`` is not offered what needs this (None: it is)."""
        capabilities = declared(getattr(adapter, "capabilities", ()))
        name = getattr(adapter, "name", "the adapter")
        missing = sorted(self.capabilities - capabilities)
        if missing:
            return f"{name} does not declare {', '.join(missing)}"
        for index, group in enumerate(self.alternatives):
            if not any(alternative <= capabilities for alternative in group):
                wanted = " or ".join(" + ".join(sorted(a)) for a in group)
                return f"{name} declares no {self.why.get(str(index), 'alternative')} ({wanted})"
        if self.layer_caches and not drives_layer_caches(adapter):
            return (f"{name} drives no layer caches (it has none of {', '.join(LAYER_METHODS)}; a RoPE pairing it "
                    "declares names its decoders' RoPE)")
        storage = declared_storage(adapter) if self.unstored is not None else None
        if storage is not None and storage.scale not in ROW_OWN_SCALES:
            return f"{name} declares storage scaled {storage.scale}: {self.unstored}"
        if self.families is not None:
            limits = LayerLimits.of(adapter)
            buildable = layer_families(capabilities, limits)
            if not any(style in (None, s) and grouped in (None, g) for s, g in buildable
                       for style, grouped in self.families):
                described = limits.described()
                return (f"{name} can build no layer of this kind within what it declares"
                        + (f" (layer_limits {described})" if described else ""))
        for declared_name, recorded, relied_on_by in self.declarations:
            here = declaration(declared_name).read(adapter)
            if not declaration(declared_name).admits(recorded, here):
                return (f"{name} declares {declared_name} {here!r}, but the trace was drawn under {recorded!r}, "
                        f"which {relied_on_by} relied on")
        for capability, claimed, relied_on_by in self.claims:
            if claimed and capability not in capabilities:
                return (f"{name} does not claim {capability}, but the trace's later steps were drawn after "
                        f"{relied_on_by} rejected under it (an adapter that does not claim it may accept, and the "
                        "state those steps were drawn on is then replaced)")
            if not claimed and capability in capabilities:
                return (f"{name} claims {capability}, but the trace's later steps were drawn after {relied_on_by} "
                        "accepted without it, and the state replaced (an adapter claiming it rejects the call)")
        return None


def _value(name: str, entry: Any) -> Any:
    if not isinstance(entry, Mapping) or "value" not in entry:
        raise UnknownDeclaration(f"{name!r}: expected {{'value', 'relied_on_by'}}, got {entry!r}")
    return entry["value"]


def declared_here(adapter: Any, names: Iterable[str]) -> str:
    """``names`` with what ``adapter`` declares of each, for a skip reason."""
    return ", ".join(f"{name} {value!r}" for name, value in declared_values(adapter, names).items())
