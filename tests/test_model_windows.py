"""Windowed stores at model level (issue 37, items 2 and 3): the cell model's eviction rules, the declarations, the
window edges met on purpose in a default run, and the minimal windowed example conforming to what it claims."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from impl.conformance import make_full_declaration_adapter
from impl.model_conformance import make_ring_model_adapter, make_windowed_store_model_adapter
from kvcache_conformance.machines.base import CALL_OUTCOMES
from kvcache_conformance.machines.model import EVICTED_SHARED
from kvcache_conformance.oracle import ContextConfig, ModelBatch, ModelConfig, random_model_weights
from kvcache_conformance.oracle.model import CellContext, Model
from kvcache_conformance.protocol.declarations import declaration_problems
from kvcache_conformance.protocol.model import ModelPolicy, ModelPolicyError
from kvcache_conformance.run import profiles, selection
from kvcache_conformance.run.exercise import RAN
from kvcache_conformance.run.runner import run_machine
from kvcache_conformance.traces import codec, replay

CONFIG = ModelConfig(vocab=6, model_width=4, layers=1, heads=1, kv_heads=1, head_width=2, ffn_width=4, window=3)


def context(sinks: int = 0, evicts: bool = True, cells: int = 16) -> CellContext:
    model = Model(CONFIG, random_model_weights(CONFIG, 7))
    return CellContext(model, ContextConfig(cells=cells, max_sequences=2, sinks=sinks), evicts=evicts)


def decoded(oracle: CellContext, count: int, seq: int = 0, start: int = 0) -> CellContext:
    oracle.decode(ModelBatch.of_sequence(seq, list(np.arange(count) % CONFIG.vocab), start))
    return oracle


# -- the cell model: what may be evicted, and what follows ---------------------------------------------------------

def test_only_cells_no_later_token_sees_may_be_evicted_never_the_last() -> None:
    oracle = decoded(context(), 6)  # positions 0..5, W 3: the next token (6) sees 4 and 5
    assert [c.position for c in oracle.evictable(0)] == [0, 1, 2, 3]
    assert oracle.follow_eviction(0, 5) is not None  # 4 is still seen
    assert oracle.pos_min(0) == 0  # an illegal report changes nothing
    assert oracle.follow_eviction(0, 4) is None
    assert (oracle.pos_min(0), oracle.evicted[0]) == (4, {0, 1, 2, 3})
    assert decoded(context(), 2).follow_eviction(0, -1) is not None  # every cell gone, the last one too


def test_sinks_are_never_evicted_and_evictions_behind_them_are_uncertain() -> None:
    oracle = decoded(context(sinks=1), 6)
    assert [c.position for c in oracle.evictable(0)] == [1, 2, 3]
    assert oracle.follow_eviction(0, 1) is not None  # the sink at 0 gone
    assert oracle.follow_eviction(0, 0) is None  # the sink reported: what is held behind it is unknown
    assert sorted(c.position for c in oracle.cells_of(0) if 0 in c.uncertain) == [1, 2, 3]


def test_a_removal_that_brings_an_evicted_position_back_into_view_is_known() -> None:
    oracle = decoded(context(), 6)
    assert oracle.follow_eviction(0, 3) is None
    oracle.remove(0, 5, -1)  # the next token (5) sees 3 and 4: nothing evicted
    assert oracle.reaches_evicted() is None
    oracle.remove(0, 4, -1)  # the next token (4) would see 2, evicted
    assert oracle.reaches_evicted() == "evicted"
    oracle.remove(0, -1, -1)  # an empty sequence starts anew
    assert oracle.reaches_evicted() is None and not oracle.evicted


def test_with_global_layers_eviction_leaves_them_every_cell() -> None:
    """Windowed and global layers (llama.cpp's iswa, transformers' sliding and full layers): an eviction is of the
    windowed store alone; seq_pos_min is its, the global layer still attends every cell, a copy and a save carry
    what the windowed store lost."""
    mixed = dataclasses.replace(CONFIG, layers=2, window_pattern=(True, False))
    weights = random_model_weights(mixed, 7)

    def mixed_context(evicts: bool) -> CellContext:
        return CellContext(Model(mixed, weights), ContextConfig(cells=16, max_sequences=2), evicts=evicts)

    tokens = [1, 2, 3, 4, 5, 0]
    kept, evicting = mixed_context(False), mixed_context(True)
    for oracle in (kept, evicting):
        oracle.decode(ModelBatch.of_sequence(0, tokens, 0))
    assert evicting.split and evicting.follow_eviction(0, 3) is None
    assert (evicting.pos_min(0), evicting.pos_max(0), len(evicting.cells_of(0))) == (3, 5, 6)
    step = ModelBatch.of_sequence(0, [2], 6)
    expected = kept.decode(step)
    np.testing.assert_allclose(evicting.decode(step), expected, rtol=0, atol=1e-12)  # the global layer saw 0..2
    # a store evicting the cells from every layer: the global layer no longer sees 0..2, and the logits differ
    uniform = CellContext(Model(mixed, weights), ContextConfig(cells=16, max_sequences=2), evicts=True)
    uniform.split = False
    uniform.decode(ModelBatch.of_sequence(0, tokens, 0))
    assert uniform.follow_eviction(0, 3) is None
    assert np.max(np.abs(uniform.decode(step) - expected)) > 1e-6
    evicting.copy(0, 1, -1, -1)  # the copy lacks in its windowed store what the source lacked
    assert (evicting.pos_min(1), evicting.pos_max(1), len(evicting.cells_of(1))) == (3, 6, 7)
    evicting.load(0, evicting.save(1))
    assert (evicting.pos_min(0), len(evicting.cells_of(0))) == (3, 7)


def test_past_the_free_cells_a_store_that_evicts_may_be_full() -> None:
    oracle = decoded(context(cells=4), 4)
    oracle.decode(ModelBatch.of_sequence(0, [1], 4))  # no ModelRefusal: the engine may reuse an evictable cell
    assert oracle.may_be_full
    with pytest.raises(Exception, match="full"):
        decoded(context(evicts=False, cells=4), 4).decode(ModelBatch.of_sequence(0, [1], 4))


def test_a_sink_stays_visible_past_the_window() -> None:
    oracle = context(sinks=1)
    assert oracle.sees(9, 0) and not oracle.sees(9, 1) and oracle.sees(9, 7) and not oracle.sees(9, 10)


# -- the declarations --------------------------------------------------------------------------------------------

def test_the_window_declarations_are_read_and_checked() -> None:
    class Declares:
        def __init__(self, **policy: str) -> None:
            self.model_policy = policy

    policy = ModelPolicy.of(Declares(window_cells="visible", window_removal="until_full"))
    assert (policy.window_cells, policy.window_removal) == ("visible", "until_full")
    assert ModelPolicy().window_cells == "all" and ModelPolicy().window_removal == "any"
    with pytest.raises(ModelPolicyError):
        ModelPolicy.of(Declares(window_cells="some"))


def test_attention_sinks_may_be_declared_by_a_whole_model_with_a_window() -> None:
    class Model:
        name, version = "m", "1"
        capabilities = frozenset({"whole_model", "sliding_window", "attention_sinks", "rope_interleaved"})

    assert not [p for p in declaration_problems(Model()) if "attention_sinks" in p]
    Model.capabilities = frozenset({"whole_model", "attention_sinks", "rope_interleaved"})
    assert [p for p in declaration_problems(Model()) if "attention_sinks" in p]


# -- the machine meets the window's edges on purpose ------------------------------------------------------------------

WINDOWED = ("outgrow_the_window_then_change", "sinks_past_a_wrap", "remove_to_the_end_around_a_full_window",
            "evict_a_cell_another_sequence_sees")
FLOOR = 0.004  # tests/test_model_chains.py's floor of a rule's share of the steps
# The evicting store's run is twice the default run's examples, as tests/test_model_chains.py's WINDOW_EXAMPLES: these
# rules run only for the windowed half of the models, and 100 examples were one program's luck. Measured 2026-12-06,
# when shared_prompt's own tokens became three draws in four (a derandomised run of 100 then gave
# outgrow_the_window_then_change 0.0029 of the steps and no sink kept past a wrap): five random runs of 100 gave the
# rule 0.0049 to 0.017 and met a refusal for an evicted cell 0 to 17 times and a sink past a wrap 2 to 59 times, and
# five random runs before the change 0 to 14 and 1 to 67 -- no 100 examples meet each case in every run; the
# derandomised run of 200 gives the three rules 0.0225, 0.0129, 0.0187 and meets the cases 162, 16 and 24 times.
EVICTING_EXAMPLES = 200
# evict_a_cell_another_sequence_sees runs only in a unified context of two or more sequences, under a store that evicts:
# measured 2026-12-06, the derandomised run of 200 gives it 0.0039 of the steps (the case met 20 times), five random
# runs of 200 0.0061 to 0.0169 (met 28 to 72 times, ring and windowed store); its floor is a quarter of the first.
RULE_FLOORS = {"evict_a_cell_another_sequence_sees": 0.001}


@functools.cache
def run(factory: Callable[[], object], examples: int = 100) -> Counter[tuple[str, str]]:
    """A derandomised run of the model machine (the default profile's): (rule, case or outcome) -> times."""
    settings = profiles.settings_for("dev", database=None, max_examples=examples, derandomize=True, deadline=None)
    result = run_machine("model", factory(), property_id="tests::model_windows", settings=settings)
    assert result.failure is None, result.failure
    return Counter(result.exercise.counts)


def exercised(factory: Callable[[], object], examples: int = 100) -> Counter[tuple[str, str]]:
    return Counter({key: times for key, times in run(factory, examples).items()
                    if key[1] not in (RAN, *CALL_OUTCOMES)})


@pytest.mark.slow
def test_the_window_rules_keep_their_floor_where_stores_evict() -> None:
    steps = {rule: times for (rule, what), times in run(make_ring_model_adapter, EVICTING_EXAMPLES).items()
             if what == RAN}
    total = sum(steps.values())
    thin = {rule: round(steps.get(rule, 0) / total, 4) for rule in WINDOWED
            if steps.get(rule, 0) / total < RULE_FLOORS.get(rule, FLOOR)}
    assert not thin, thin


@pytest.mark.slow
def test_eviction_a_refusal_for_an_evicted_cell_and_a_sink_past_a_wrap_are_met_in_a_default_run() -> None:
    cases = exercised(make_ring_model_adapter, EVICTING_EXAMPLES)
    for rule, case in (("outgrow_the_window_then_change", "window outgrown"),
                       ("outgrow_the_window_then_change", "refused for an evicted cell"),
                       ("sinks_past_a_wrap", "sink kept past a wrap"),
                       ("evict_a_cell_another_sequence_sees", EVICTED_SHARED)):
        assert cases[(rule, case)] >= 3, (rule, case, sorted(cases.items()))


@pytest.mark.slow
def test_sinks_past_a_wrap_are_met_with_the_full_declaration() -> None:
    # by any rule: after the window-edge rules of issue 37 joined, the derandomised run met the case 7 times, in
    # outgrow_the_window and remove_across_the_window_edge, and in none of sinks_past_a_wrap's runs
    cases = exercised(make_full_declaration_adapter)
    assert sum(times for (_, what), times in cases.items() if what == "sink kept past a wrap") >= 3


def test_the_minimal_windowed_example_conforms_to_what_it_claims() -> None:
    adapter = selection.load_adapter("examples.minimal_windowed_model_adapter:make_adapter")
    result = run_machine("model", adapter, property_id="model-windowed-example",
                         settings=profiles.settings_for("ci", database=None, max_examples=30))
    assert result.failure is None, result.failure


@pytest.mark.parametrize("factory", [make_windowed_store_model_adapter, make_ring_model_adapter])
def test_a_shift_of_a_cell_its_sequence_may_have_evicted_unseen_is_not_judged(factory: object) -> None:
    """Found by a derandomised run (2026-12-06): in a unified context with a sink, sequence 1 (a merged copy of
    sequence 0, both holding a cell at 8) lazily drops its share of 8 behind its sink, unseen by seq_pos_min, then
    shifts [8, end): whether 8 moves for sequence 0 depends on that unseen eviction. The oracle once moved it and
    failed both evicting references ("holds 0..8, should hold 0..10"); such a move is now outside what is judged."""
    trace = Path(__file__).parent / "replay-cases" / "ring-shift-of-a-cell-shared-after-unseen-eviction.json"
    verdict = replay.replay(codec.load(trace), factory(), out=lambda line: None)  # type: ignore[operator]
    assert verdict.conforms, verdict.message
