"""docs/spec.md §13.8: a ragged batch -- rows at their own offsets, chunks of per-row lengths, merged, extracted,
filtered, selected, repeated and truncated -- shows every row's own tokens as the oracle computes them, after every
step.

One property, drawing the layer's family per example among those the adapter can build; each operation is drawn
only where its capability is declared.
"""

from __future__ import annotations

from kvcache_conformance.run.runner import PropertyRun


def test_batches_conform(conformance: PropertyRun) -> None:
    conformance.run("batches")
