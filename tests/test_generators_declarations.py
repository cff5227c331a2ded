"""Every generator that takes declarations draws only within them; the one gate agrees with what can be drawn."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from impl.conformance import PrefillWithinWindowAdapter, ReferenceAdapter, SinksRingAdapter, WindowUntilFullAdapter
from kvcache_conformance import generate as g
from kvcache_conformance.generate.needs import LAYER_CONVENTION, Needs
from kvcache_conformance.machines.layer import LayerCacheMachine
from kvcache_conformance.protocol.declarations import LayerLimits, declaration_problems
from kvcache_conformance.protocol.kinds import declared
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine

pytestmark = pytest.mark.slow  # whole machine runs, counting what they drew (on Python 3.11 only)

FAST = settings(max_examples=60, database=None, deadline=None)
REFERENCE = declared(ReferenceAdapter.capabilities)
CAPABILITIES = [REFERENCE, frozenset({"rope_half_split"}), frozenset({"positionless", "gqa"}),
                frozenset({"rope_interleaved", "partial_rotary", "gqa"})]
LIMITS = [LayerLimits(), LayerLimits(model_width_is_heads_times_head_width=True, max_heads=2),
          LayerLimits(model_width_divisible_by_heads=True, min_head_width=4, head_width_multiple=4),
          LayerLimits(max_heads=1, max_model_width=3, max_rotary_width=2, max_batch=1, max_capacity=5),
          LayerLimits(min_head_width=32)]


@pytest.mark.parametrize("limits", LIMITS, ids=lambda limits: str(limits.described()) or "none")
@pytest.mark.parametrize("capabilities", CAPABILITIES, ids=lambda c: "+".join(sorted(c))[:40])
def test_layers_are_drawn_only_within_what_is_declared(capabilities: frozenset[str], limits: LayerLimits) -> None:
    families = tuple(g.layer_families(capabilities, limits))
    for style, grouped in families:
        assert style in g.position_styles(capabilities) and (not grouped or "gqa" in capabilities)
    for heads, kv_heads, dh, widths in g.geometries(capabilities, limits):
        assert all(limits.geometry_problem(w, heads, dh) is None for w in widths)
        assert kv_heads == heads or "gqa" in capabilities
    if not families:
        return

    @FAST
    @given(config=g.layer_configs(capabilities, limits=limits, families=families))
    def drawn(config: g.LayerConfig) -> None:
        assert g.requirements_of(config) <= capabilities, config
        assert g.layers.limits_problem(config, limits) is None, (config, limits)
        family = ("none" if config.rope is None else config.rope.style,
                  config.weights.kv_heads < config.weights.heads)
        assert family in families

    drawn()


def test_wider_heads_than_the_documented_range_are_drawn_only_where_the_limits_ask() -> None:
    assert g.head_widths() == [2, 4, 6, 8]
    assert g.head_widths(LayerLimits(min_head_width=32)) == [32]
    assert g.head_widths(LayerLimits(head_width_multiple=4)) == [4, 8]
    assert g.head_widths(LayerLimits(min_head_width=9, max_head_width=9)) == []


@pytest.mark.parametrize("group, declared_limits, widths", [
    (4, {}, [4, 8]), (3, {}, [6]), (32, {}, [32]), (64, {}, [64]), (4, {"head_width_multiple": 8}, [8]),
    (2, {"min_head_width": 6}, [6, 8])])
def test_affine_groups_draw_only_heads_they_divide(group: int, declared_limits: dict[str, int],
                                                   widths: list[int]) -> None:
    class Affine:
        def __init__(self) -> None:
            self.storage = {"format": "uint4", "scale": "per_group", "group": group}
            self.layer_limits = declared_limits

    limits = LayerLimits.of(Affine())
    assert g.head_widths(limits) == widths
    assert {dh for _, _, dh, _ in g.geometries(REFERENCE, limits)} == set(widths)

    @FAST
    @given(config=g.layer_configs(REFERENCE, limits=limits))
    def drawn(config: g.LayerConfig) -> None:
        assert config.weights.head_width % group == 0, config

    drawn()


@pytest.mark.parametrize("limits", LIMITS[:4], ids=lambda limits: str(limits.described()) or "none")
@pytest.mark.parametrize("capabilities", CAPABILITIES, ids=lambda c: "+".join(sorted(c))[:40])
def test_layers_of_other_geometry_stay_within_the_limits_and_the_rotary_width(capabilities: frozenset[str],
                                                                                 limits: LayerLimits) -> None:
    adapter: Any = type("Declared", (ReferenceAdapter,), {"capabilities": capabilities,
                                                           "layer_limits": limits})()
    families = tuple(g.layer_families(capabilities, limits))
    if not families:
        return

    @FAST
    @given(config=g.layer_configs(capabilities, limits=limits, families=families))
    def changes(config: g.LayerConfig) -> None:
        machine = LayerCacheMachine(adapter)
        machine.config = config
        for width, heads, kv_heads, dh in machine.geometry_changes.values():
            assert limits.geometry_problem(width, heads, dh) is None
            assert kv_heads == heads or "gqa" in capabilities
            if config.rope is not None and "partial_rotary" not in capabilities:
                assert dh <= (limits.max_rotary_width or dh)  # a full rotary width still within its limit

    changes()


@given(data=st.data())
@FAST
def test_decoders_use_rope_only_with_a_declared_pairing(data: st.DataObject) -> None:
    for capabilities in (frozenset({"positions_rope", "positions_sinusoidal"}),
                         frozenset({"positions_rope", "rope_half_split"}), REFERENCE):
        for strategy in (g.decoder_configs(capabilities), g.paged_decoder_configs(capabilities)):
            config = data.draw(strategy)
            assert g.requirements_of(config) <= capabilities | {"sliding_window", "gqa"}, (config, capabilities)
    with pytest.raises(ValueError, match="declares no decoder position convention"):
        data.draw(g.decoder_configs(frozenset({"positions_rope"})))


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_other_batches_come_smaller_first_then_larger_then_empty(batch: int) -> None:
    others = g.inputs.other_batches(batch)
    assert batch not in others and 0 in others and batch + 1 in others
    assert others[0] == (1 if batch > 1 else batch + 1)


def test_malformed_rows_reach_one_row_into_a_larger_batch_a_larger_batch_and_none() -> None:
    seen: set[str] = set()

    @settings(max_examples=400, database=None, deadline=None)
    @given(g.malformed_rows(3, 4))
    def drawn(bad: g.MalformedRow) -> None:
        shape = getattr(bad.value, "shape", ())
        if "batch_mismatch" in bad.problems and len(shape) == 3:
            seen.add("single" if shape[0] == 1 else "larger" if shape[0] > 3 else "none" if shape[0] == 0 else "")

    drawn()
    assert {"single", "larger", "none"} <= seen


def test_the_gate_names_what_is_missing_and_passes_what_applies() -> None:
    paged_only: Any = type("PagedOnly", (), {"name": "paged-only", "capabilities": frozenset(
        {"paged_prefix_sharing", "positions_rope", "rope_half_split"})})()
    layers = Needs.of(alternatives=[("layer convention", LAYER_CONVENTION)], families=((None, None),))
    assert "drives no layer caches" in (layers.problem(paged_only) or "")
    assert layers.problem(ReferenceAdapter()) is None
    tied: Any = type("Tied", (ReferenceAdapter,), {"layer_limits": {"max_heads": 1}})()
    assert "can build no layer" in (Needs.of("gqa", families=((None, True),)).problem(tied) or "")
    assert "does not declare decode_session" in (Needs.of("decode_session").problem(paged_only) or "")


def test_the_window_run_truncates_full_windows_of_a_cache_that_truncates_until_full() -> None:
    """window_truncates_until_full is judged where it matters: the windowed run truncates caches that hold W
    rows or more (refused), and caches that hold fewer (done)."""
    seen: set[str] = set()

    class Counting(WindowUntilFullAdapter):
        def truncate(self, cache: Any, n: Any) -> None:
            seen.add("full" if cache.length >= cache.window else "not full")
            super().truncate(cache, n)

    result = run_machine("cache_operations", Counting(), property_id="generators-until-full",
                         parameters={"windowed": True},
                         settings=profiles.settings_for("ci", max_examples=30, database=None))
    assert result.failure is None, result.failure
    assert seen == {"full", "not full"}


def test_the_window_run_truncates_rings_of_window_and_sinks_on_both_sides_of_full() -> None:
    """window_full_counts_sinks is judged where it differs from W: caches with sinks are truncated holding W to
    W + S - 1 rows (done) and W + S or more (refused)."""
    seen: set[str] = set()

    class Counting(SinksRingAdapter):
        def truncate(self, cache: Any, n: Any) -> None:
            if cache.sinks:
                seen.add("full" if cache.length >= cache.window + cache.sinks else
                         "past W, not full" if cache.length >= cache.window else "below W")
            super().truncate(cache, n)

    result = run_machine("cache_operations", Counting(), property_id="generators-full-counts-sinks",
                         parameters={"windowed": True},
                         settings=profiles.settings_for("ci", max_examples=30, database=None))
    assert result.failure is None, result.failure
    assert {"full", "past W, not full"} <= seen


def test_a_session_that_refuses_long_prefills_meets_prefills_of_w_and_of_more_than_w_tokens() -> None:
    """prefill_within_window is judged both ways: the session machine hands windowed sessions prefills of exactly
    W tokens (which must succeed) and of more than W (refused, changing nothing), with and without rows held."""
    seen: set[str] = set()

    class Counting(PrefillWithinWindowAdapter):
        def prefill(self, session: Any, tokens: Any) -> Any:
            window = session.model.window
            if window is not None and isinstance(tokens, list) and session.length + len(tokens) <= session.capacity:
                seen.add(("W" if len(tokens) == window else "more than W" if len(tokens) > window else "fewer")
                         + (" onto rows held" if session.length else ""))
            return super().prefill(session, tokens)

    result = run_machine("session", Counting(), property_id="generators-prefill-within-window",
                         settings=profiles.settings_for("ci", database=None))  # the ci profile's 100 examples
    assert result.failure is None, result.failure
    assert {"W", "more than W", "W onto rows held", "more than W onto rows held"} <= seen, seen


def test_prefills_within_the_window_need_a_windowed_session() -> None:
    lone: Any = type("Lone", (ReferenceAdapter,), {"capabilities": ReferenceAdapter.capabilities - {
        "sliding_window"} | {"prefill_within_window"}})()
    assert any("prefill_within_window" in problem for problem in declaration_problems(lone))
    assert not declaration_problems(PrefillWithinWindowAdapter())


def test_a_window_full_counting_sinks_needs_what_it_is_about() -> None:
    lone: Any = type("Lone", (ReferenceAdapter,), {"capabilities": ReferenceAdapter.capabilities | {
        "window_full_counts_sinks"}})()
    assert any("window_full_counts_sinks" in problem for problem in declaration_problems(lone))
    assert not declaration_problems(SinksRingAdapter())


def test_window_caches_are_drawn_with_sinks_only_where_declared() -> None:
    drawn: dict[bool, set[int]] = {True: set(), False: set()}

    class Recording(ReferenceAdapter):
        declares = True

        def create_cache(self, layer: Any, batch_size: int, capacity: int, window: int | None = None,
                         **sinks: int) -> Any:
            if window is not None:
                drawn[self.declares].add(sinks.get("sinks", 0))
            return super().create_cache(layer, batch_size, capacity, window, **sinks)

    class Undeclared(Recording):
        declares = False
        capabilities = ReferenceAdapter.capabilities - {"attention_sinks"}

    for adapter in (Recording(), Undeclared()):
        result = run_machine("cache_operations", adapter, property_id="generators-sinks",
                             parameters={"windowed": True},
                             settings=profiles.settings_for("ci", max_examples=100, database=None))
        assert result.failure is None, result.failure
    assert drawn == {True: {0, 1, 2}, False: {0}}


@pytest.mark.parametrize("fork", ["shared", "re_add", "none"])
def test_forks_are_drawn_as_the_paged_policy_declares(fork: str) -> None:
    forked: list[int] = []  # the parent's length at each paged_fork

    class Recording(ReferenceAdapter):
        paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy, "fork": fork}

        def paged_fork(self, pool: Any, sequence: Any) -> Any:
            forked.append(len(pool.tokens(sequence)))
            return super().paged_fork(pool, sequence)

    result = run_machine("paged", Recording(), property_id=f"generators-fork-{fork}",
                         settings=profiles.settings_for("ci", max_examples=30, database=None))
    assert result.failure is None, result.failure
    if fork == "none":
        assert forked == []  # no rule forks: not fork, fork_and_append_to_both, nor the truncation rules
    else:
        assert forked, "no fork drawn"
        if fork == "re_add":  # a re-adding fork of no tokens is unspecified: never drawn
            assert min(forked) >= 1, forked


def test_selections_and_repeats_are_drawn_as_the_spec_allows_and_only_where_declared() -> None:
    calls: dict[str, list[Any]] = {"select": [], "repeat_interleave": [], "batches": []}

    class Recording(ReferenceAdapter):
        def select(self, cache: Any, indices: Any) -> None:
            calls["select"].append((cache.batch_size, indices))
            super().select(cache, indices)

        def repeat_interleave(self, cache: Any, repeats: Any) -> None:
            calls["repeat_interleave"].append((cache.batch_size, repeats))
            super().repeat_interleave(cache, repeats)

        def step(self, layer: Any, cache: Any, x: Any) -> Any:
            calls["batches"].append(cache.batch_size)
            return super().step(layer, cache, x)

    class Undeclared(Recording):
        capabilities = ReferenceAdapter.capabilities - {"batch_select", "batch_repeat"}

    for adapter in (Recording(), Undeclared()):
        before = len(calls["select"]) + len(calls["repeat_interleave"])
        result = run_machine("cache_operations", adapter, property_id="generators-batch-size",
                             settings=profiles.settings_for("ci", max_examples=100, database=None))
        assert result.failure is None, result.failure
        if isinstance(adapter, Undeclared):
            assert len(calls["select"]) + len(calls["repeat_interleave"]) == before
    valid = [(b, list(i)) for b, i in calls["select"] if np.asarray(i).dtype.kind in "iu" and len(i)
             and min(i) >= 0 and max(i) < b]
    assert valid and all(i == sorted(set(i)) and 1 <= len(i) <= b for b, i in valid), valid
    assert any(len(i) < b for b, i in valid)  # the batch shrinks
    counts = [(b, r) for b, r in calls["repeat_interleave"] if type(r) is int and r >= 1]
    assert any(r >= 2 for _, r in counts) and all(b * r <= 6 for b, r in counts), counts
    assert max(calls["batches"]) > 3  # a repeat grew the batch past the largest one a cache is created with


def test_request_keys_are_drawn_only_where_declared_and_collide_across_keys() -> None:
    given: list[Any] = []

    class Recording(ReferenceAdapter):
        paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy,
                                                  "hash_keys": ["scope", "signature", "lora", "salt"]}

        def paged_add(self, pool: Any, decoder: Any, scope: str, tokens: Any, *keys: Any) -> Any:
            given.append(keys)
            return super().paged_add(pool, decoder, scope, tokens, *keys)

    class Undeclared(Recording):
        paged_policy: ClassVar[dict[str, Any]] = ReferenceAdapter.paged_policy

    for adapter in (Recording(), Undeclared()):
        start = len(given)
        result = run_machine("paged", adapter, property_id="generators-request-keys",
                             settings=profiles.settings_for("ci", max_examples=30, database=None))
        assert result.failure is None, result.failure
        drawn = given[start:]
        if isinstance(adapter, Undeclared):
            assert drawn and all(keys == () for keys in drawn)  # no keys argument at all
            continue
        assert drawn and all(len(keys) == 1 and set(keys[0]) == {"lora", "salt"} for keys in drawn)
        values = [keys[0] for keys in drawn]
        assert all(set(v.values()) <= {"", "X", "app"} for v in values)
        assert {"lora": "X", "salt": ""} in values and {"lora": "", "salt": "X"} in values  # one value, two keys
