"""What each machine needs and which rules it has, from the machines themselves.

The rule tables of docs/adapters.md are this module's output
(``kvcache-conformance rules --markdown``; tests/test_docs.py fails when the
docs drift from it). A rule's name is what ``--kv-xfails FILE`` takes after
``::``, what a trace records and what the report calls "the rule of the
failing step".
"""

from __future__ import annotations

from dataclasses import dataclass

from ..generate.needs import Needs
from ..machines import MACHINES
from ..traces.recording import RuleSpec

# The properties that run each machine, as pytest names them (parameters in brackets), and the parameters the
# machine's needs are asked with.
PROPERTIES: dict[str, tuple[tuple[str, dict[str, object]], ...]] = {
    "layer_cache": (("test_layer_cache.py::test_layer_cache_conforms", {}),),
    "cache_operations": (("test_cache_operations.py::test_cache_operations_conform[full]", {}),
                         ("test_cache_operations.py::test_cache_operations_conform[window]", {"windowed": True})),
    "session": (("test_session.py::test_decode_session_conforms", {}),),
    "prefix_store": (("test_prefix_store.py::test_prefix_store_conforms[full-attention]", {"windowed": False}),
                     ("test_prefix_store.py::test_prefix_store_conforms[sliding-window]", {"windowed": True})),
    "paged": (("test_paged_cache.py::test_paged_cache_conforms", {}),),
    "model": (("test_whole_model.py::test_whole_model_conforms", {}),),
    "batches": (("test_batches.py::test_batches_conform", {}),),
    "layered_cache": (("test_layered_cache.py::test_layered_cache_conforms", {}),),
}


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str  # "set-up" or "rule"
    requires: tuple[str, ...]
    summary: str


def needs_described(needs: Needs) -> str:
    """``needs`` in words, as the docs say it."""
    parts = [f"`{c}`" for c in sorted(needs.capabilities)]
    for index, group in enumerate(needs.alternatives):
        options = " or ".join(" + ".join(f"`{c}`" for c in sorted(a)) for a in group)
        parts.append(f"a {needs.why.get(str(index), 'choice')} ({options})")
    if needs.layer_caches:
        parts.append("the layer-cache methods")
    return "; ".join(parts) or "nothing"


def rules_of(machine: str) -> list[Rule]:
    """Set-up rules first, then the rules, each alphabetically (invariants are not rules: they cannot be left
    out)."""
    specs: dict[str, RuleSpec] = MACHINES[machine].specs()
    cls = MACHINES[machine]
    found = []
    for name, spec in specs.items():
        if spec.kind == "invariant":
            continue
        doc = (getattr(cls, name).__doc__ or "").strip().split("\n\n")[0]
        summary = " ".join(doc.split()).split(". ")[0].rstrip(".")
        found.append(Rule(name, "set-up" if spec.kind == "initialize" else "rule", tuple(sorted(spec.requires)),
                          summary))
    return sorted(found, key=lambda r: (r.kind != "set-up", r.name))


def markdown() -> str:
    """The docs' section: per machine, its properties, what they need, and its rules."""
    lines = []
    for machine, properties in PROPERTIES.items():
        cls = MACHINES[machine]
        lines.append(f"#### `{machine}` ({cls.__name__})")
        lines.append("")
        for node, parameters in properties:
            lines.append(f"- `{node}` needs {needs_described(cls.needs(**parameters))}")
        lines.append("")
        lines.append("| rule | drawn only with | what it does |")
        lines.append("|---|---|---|")
        for rule in rules_of(machine):
            name = f"`{rule.name}`" + (" (set-up)" if rule.kind == "set-up" else "")
            requires = ", ".join(f"`{c}`" for c in rule.requires) or "—"
            lines.append(f"| {name} | {requires} | {rule.summary.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def plain() -> str:
    """The rule names, a machine a line: for a terminal."""
    return "\n".join(f"{machine}: {', '.join(r.name for r in rules_of(machine) if r.kind == 'rule')}"
                     for machine in PROPERTIES) + "\n"
