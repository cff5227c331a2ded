"""What a property, a machine or a trace needs of an adapter to apply -- like test262's ``features`` -- and the
one gate that decides it.

A property or trace that does not apply is skipped with the reason, never
failed: the gate is asked before anything is drawn (``PropertyRun``) and
before a trace is replayed (``traces.replay``), and generators draw only
within the declarations, so what passed the gate never meets an
``Unsatisfiable``, an ``AttributeError`` or a "declares no ...".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..protocol.declarations import LAYER_METHODS, LayerLimits, drives_layer_caches
from ..protocol.kinds import Capability, declared
from .layers import layer_families

Alternatives = tuple[frozenset[str], ...]  # one of these sets of capabilities, all of the set


def one_of(*alternatives: Iterable[Any]) -> Alternatives:
    return tuple(frozenset(str(getattr(c, "value", c)) for c in group) for group in alternatives)


# The layer conventions (docs/spec.md §3) and the decoders' position conventions (§2.4): a RoPE decoder needs
# the pairing it is drawn with.
LAYER_CONVENTION = one_of([Capability.ROPE_INTERLEAVED], [Capability.ROPE_HALF_SPLIT], [Capability.POSITIONLESS])
ROPE_PAIRING = one_of([Capability.ROPE_INTERLEAVED], [Capability.ROPE_HALF_SPLIT])
DECODER_POSITIONS = one_of([Capability.POSITIONS_SINUSOIDAL],
                           [Capability.POSITIONS_ROPE, Capability.ROPE_INTERLEAVED],
                           [Capability.POSITIONS_ROPE, Capability.ROPE_HALF_SPLIT])


@dataclass(frozen=True)
class Needs:
    """Capabilities all of which, and groups of alternatives one of each of which, an adapter must declare; and
    for the layer machines, the layer families its ``layer_limits`` must leave at least one geometry of."""

    capabilities: frozenset[str] = frozenset()
    alternatives: tuple[Alternatives, ...] = ()
    layer_caches: bool = False  # the adapter must drive layer caches (have the layer-cache methods)
    families: tuple[tuple[str | None, bool | None], ...] | None = None  # (style, grouped); None: any
    why: dict[str, str] = field(default_factory=dict, compare=False)  # what an alternatives group stands for

    @classmethod
    def of(cls, *capabilities: Any, alternatives: Iterable[tuple[str, Alternatives]] = (),
           families: tuple[tuple[str | None, bool | None], ...] | None = None, layer_caches: bool = False) -> Needs:
        named = list(alternatives)
        return cls(frozenset(str(getattr(c, "value", c)) for c in capabilities), tuple(a for _, a in named),
                   layer_caches or families is not None, families, {str(i): name for i, (name, _) in enumerate(named)})

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
        if self.families is not None:
            limits = LayerLimits.of(adapter)
            buildable = layer_families(capabilities, limits)
            if not any(style in (None, s) and grouped in (None, g) for s, g in buildable
                       for style, grouped in self.families):
                described = limits.described()
                return (f"{name} can build no layer of this kind within what it declares"
                        + (f" (layer_limits {described})" if described else ""))
        return None
