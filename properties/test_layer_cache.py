"""docs/spec.md §4-6 and §11: the layer-bound cache, driven at random, agrees with the oracle after every step.

One property draws the layer's family -- position convention (the two RoPE
pairings, and "none" for positionless layers) and attention kind (MHA;
GQA/MQA) -- per example, among every family the adapter can build; the
report counts the runs of each. It replaced six properties, one per family
(``test_layer_cache_conforms[interleaved-mha]`` and so on): their node ids
still name it in ``--kv-xfails`` files, narrowed to that family, and the
counterexamples saved under them are replayed first.
"""

from __future__ import annotations

import pytest

from kvcache_conformance.generate.layers import FAMILIES, family_name
from kvcache_conformance.run.runner import PropertyRun

FORMER_IDS = {family_name(style, grouped): {"style": style, "grouped": grouped} for style, grouped in FAMILIES}


@pytest.mark.kv_former_ids(FORMER_IDS)
def test_layer_cache_conforms(conformance: PropertyRun) -> None:
    conformance.run("layer_cache")
