"""The whole-model protocol's declarations: read, checked, and refused when the suite cannot judge them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from impl.model_conformance import ModelReferenceAdapter
from kvcache_conformance.judge.policy import Due, Expect
from kvcache_conformance.judge.tolerance import Judge
from kvcache_conformance.oracle import FLOAT64, ContextConfig, ModelConfig, StorageFormat
from kvcache_conformance.oracle.model_config import gemma3_config, random_model_weights
from kvcache_conformance.protocol import ModelLimits, ModelPolicy, ModelPolicyError
from kvcache_conformance.protocol.declarations import declaration_problems
from kvcache_conformance.protocol.kinds import ErrorKind
from kvcache_conformance.protocol.model import declared_kv_along, declared_kv_storage, described_kv_storage


def adapter(**attributes: Any) -> Any:
    declared = type("Declared", (ModelReferenceAdapter,), {})()
    for key, value in attributes.items():
        setattr(declared, key, value)
    return declared


def test_the_reference_declares_nothing_contradictory() -> None:
    assert declaration_problems(ModelReferenceAdapter()) == []
    assert ModelPolicy.of(ModelReferenceAdapter()) == ModelPolicy()


def test_a_policy_is_read_as_declared() -> None:
    policy = ModelPolicy.of(adapter(model_policy={"contexts": ["unified"], "copy_per_sequence": "whole_only",
                                                  "shared_copies": False}))
    assert policy.contexts == frozenset({"unified"}) and not policy.shared_copies
    assert policy.copy_into_nonempty(unified=False) == "whole_only"
    assert policy.copy_into_nonempty(unified=True) == "merge"
    assert policy.described()["copy_per_sequence"] == "whole_only"
    assert policy.removal == "any" and ModelPolicy.of(adapter(model_policy={"removal": "end_only"})).removal == \
        "end_only"
    assert policy.positions == "given" and policy.capacity == "fixed"
    assert ModelPolicy.of(adapter(model_policy={"capacity": "grows"})).described()["capacity"] == "grows"
    assert ModelPolicy.of(adapter(model_policy={"positions": "from_zero"})).described()["positions"] == "from_zero"


@pytest.mark.parametrize("given", [
    {"copy": "merge"}, {"contexts": "unified"}, {"contexts": []}, {"contexts": ["shared"]},
    {"shared_copies": "yes"}, {"copy_unified": "swap"}, {"negative_shift": "clamped"}, ["merge"],
    {"removal": "start_only"}, {"removal": True}, {"positions": "from_one"}, {"positions": None},
    {"capacity": "unbounded"}, {"capacity": False},
])
def test_a_policy_the_suite_cannot_judge_is_a_usage_error(given: Any) -> None:
    with pytest.raises(ModelPolicyError):
        ModelPolicy.of(adapter(model_policy=given))
    assert declaration_problems(adapter(model_policy=given))


def test_limits_bound_models_and_contexts() -> None:
    limits = ModelLimits.of(adapter(model_limits={"head_width_multiple": 32, "max_sequences": 2, "max_vocab": 8}))
    assert "multiple of 32" in limits.model_problem(ModelConfig(vocab=8))
    assert "vocab 16 > max_vocab 8" in limits.model_problem(ModelConfig(head_width=32))
    assert limits.model_problem(ModelConfig(vocab=8, head_width=64)) is None
    assert limits.context_problem(ContextConfig(16, 3)) and limits.context_problem(ContextConfig(16, 2)) is None
    assert ModelLimits.of(adapter(model_limits={"micro_batch": 4})).micro_batch == 4
    for bad in ({"max_heads": 0}, {"max_heads": True}, {"heads": 2}, {"model_width_divisible_by_heads": 1},
                {"micro_batch": 5}, {"micro_batch": 0}, {"micro_batch": 3, "max_batch": 3}):
        assert declaration_problems(adapter(model_limits=bad))
    divisible = ModelLimits.of(adapter(model_limits={"model_width_divisible_by_heads": True}))
    assert "not a multiple of 2 heads" in divisible.model_problem(ModelConfig(model_width=5, heads=2, kv_heads=1))
    assert divisible.model_problem(ModelConfig(model_width=6, heads=2, kv_heads=1)) is None


def test_a_norm_component_is_for_whole_models_only() -> None:
    assert declaration_problems(adapter(capabilities=ModelReferenceAdapter.capabilities - {"float64"},
                                        mixed_precision={"norm": "float32"})) == []
    layer = type("Layer", (), {"capabilities": frozenset({"rope_interleaved"}), "mixed_precision": {"norm": "float32"}})
    assert declaration_problems(layer()) == ["declares mixed_precision 'norm' without whole_model: only a whole "
                                             "model has RMSNorms"]


def test_kv_storage_defaults_to_the_dtype_and_is_checked() -> None:
    assert declared_kv_storage(adapter()) == "float64"
    assert declared_kv_storage(adapter(dtype="float32")) == "float32"
    assert declared_kv_storage(adapter(dtype="float32", kv_storage="float16")) == "float16"
    assert declaration_problems(adapter(kv_storage="q8_0"))  # a block format under float64
    assert declaration_problems(adapter(kv_storage="q5_1"))


def test_a_block_format_cache_needs_head_widths_of_whole_blocks() -> None:
    """q8_0 and q4_0 store 32 features a scale: the suite draws only head widths that are whole blocks, so the
    adapter says so (llama.cpp refuses others); without it the declaration is a problem, not a suite error."""
    for kv in ("q8_0", "q4_0"):
        for limits in (None, {"head_width_multiple": 16}):
            with pytest.raises(ValueError, match="head_width_multiple 32"):
                declared_kv_storage(adapter(dtype="float32", kv_storage=kv, model_limits=limits))
        for multiple in (32, 64):
            assert declared_kv_storage(adapter(dtype="float32", kv_storage=kv,
                                               model_limits={"head_width_multiple": multiple})) == kv


def test_block_formats_along_the_kv_row_need_whole_kv_rows() -> None:
    """``{"format": "q8_0", "along": "row"}``: blocks cut from each token's whole kv row, so the adapter declares
    ``kv_width_multiple`` 32 instead of whole heads; the judge cuts them so too."""
    for kv in ("q8_0", "q4_0"):
        row = {"format": kv, "along": "row"}
        declared = adapter(dtype="float32", kv_storage=row, model_limits={"kv_width_multiple": 32})
        assert (declared_kv_storage(declared), declared_kv_along(declared)) == (kv, "row")
        assert Judge.for_model(declared, FLOAT64).storage == StorageFormat(kv, "per_block", along="row")
        assert "whole kv row" in Judge.for_model(declared, FLOAT64).rule
        for limits in (None, {"head_width_multiple": 32}, {"kv_width_multiple": 16}):
            with pytest.raises(ValueError, match="kv_width_multiple 32"):
                declared_kv_storage(adapter(dtype="float32", kv_storage=row, model_limits=limits))
        heads = adapter(dtype="float32", kv_storage={"format": kv, "along": "head"},
                        model_limits={"head_width_multiple": 32})
        assert (declared_kv_storage(heads), declared_kv_along(heads)) == (kv, "head")
    assert declared_kv_along(adapter(dtype="float32", kv_storage="float16")) == "head"
    for bad in ({"format": "float16", "along": "row"}, {"format": "q8_0", "along": "token"}, {"format": "q8_0"},
                {"format": "q8_0", "along": "row", "group": 32}):
        with pytest.raises(ValueError, match="kv_storage as a mapping"):
            declared_kv_storage(adapter(dtype="float32", kv_storage=bad, model_limits={"kv_width_multiple": 32}))
    assert declaration_problems(adapter(dtype="float32", kv_storage={"format": "q8_0", "along": "row"}))


def test_affine_groups_as_kv_storage_need_heads_the_group_divides() -> None:
    """``kv_storage`` as a layer's affine ``storage`` mapping: judged as that format under any dtype, with
    ``head_width_multiple`` a multiple of the group; a malformed one is refused with its reason."""
    groups = {"format": "uint4", "scale": "per_group", "group": 4, "zero_point": "extreme", "min_step": 1e-7}
    for dtype in ("float64", "float32", "float16"):
        declared = adapter(dtype=dtype, kv_storage=groups, model_limits={"head_width_multiple": 8})
        assert declared_kv_storage(declared) == "uint4" and declared_kv_along(declared) == "head"
        judge = Judge.for_model(declared, FLOAT64)
        assert judge.storage == StorageFormat("uint4", "per_group", group=4, min_step=1e-7, zero_point="extreme")
        assert judge.kv_storage == "uint4" and "groups of 4" in judge.rule
        assert described_kv_storage(declared) == groups
    for limits in (None, {"head_width_multiple": 2}, {"kv_width_multiple": 4}):
        with pytest.raises(ValueError, match="head_width_multiple 4"):
            declared_kv_storage(adapter(dtype="float32", kv_storage=groups, model_limits=limits))
    for bad, complaint in (({**groups, "zero_point": "middle"}, "zero_point must be one of"),
                           ({**groups, "group": 0}, "per_group needs group"),
                           ({**groups, "update": "frozen"}, "kv_storage as a mapping"),
                           ({"format": "int8", "scale": "per_group", "group": 4}, "an integer format")):
        with pytest.raises(ValueError, match=complaint):
            declared_kv_storage(adapter(dtype="float32", kv_storage=bad, model_limits={"head_width_multiple": 4}))
    assert described_kv_storage(adapter(dtype="float32", kv_storage="float16")) == "float16"


def test_sequence_operations_need_whole_model() -> None:
    problems = declaration_problems(adapter(capabilities=frozenset({"seq_copy", "seq_shift"})))
    assert problems == ["declares seq_copy, seq_shift without whole_model, the contexts they work on"]
    assert declaration_problems(adapter(capabilities=frozenset({"multi_sequence_tokens"}))) == [
        "declares multi_sequence_tokens without whole_model, the contexts they work on"]


def test_a_cache_is_the_dtype_or_narrower_than_it() -> None:
    assert declared_kv_storage(adapter(dtype="float32", kv_storage="bfloat16")) == "bfloat16"
    for dtype, kv in (("float16", "float32"), ("float64", "float32"), ("float32", "float64")):
        with pytest.raises(ValueError):
            declared_kv_storage(adapter(dtype=dtype, kv_storage=kv))


def test_the_model_judge_reads_dtype_and_kv_storage() -> None:
    exact = Judge.for_model(adapter(), FLOAT64)
    assert exact.naive is None and exact.storage is None and exact.kv_storage == "float64"
    same = Judge.for_model(adapter(dtype="float32"), FLOAT64)
    # a cache in the dtype itself: the rounding errors any float32 evaluation may have (docs/spec.md §8.3)
    assert same.storage is None and same.kv_storage == "float32" and same.naive.reads_errors
    narrow = Judge.for_model(adapter(dtype="float32", kv_storage="float16"), FLOAT64)
    assert narrow.storage.format == "float16" and narrow.kv_storage == "float16"
    # a narrower cache: the errors any correct store and float32 evaluation may have (docs/spec.md §15.6)
    assert narrow.naive.reads_errors and narrow.naive.within is not None and narrow.naive.softmax is not None
    assert narrow.naive.name == "rounding errors of float32"


def test_a_float64_model_whose_rounding_may_come_near_1e_12_is_judged_by_its_estimate() -> None:
    """docs/spec.md §15.6 (change 59): a 7-layer Gemma 3 (whose correct evaluations err up to 8.1e-12) token by
    token by its float64 estimate, plus 1e-12; a 1-layer Llama at 1e-12, as before; other dtypes untouched."""
    judge = Judge.for_model(adapter(), FLOAT64)
    shallow = ModelConfig(layers=1)
    assert judge.for_weights(shallow, random_model_weights(shallow, 0)) is judge
    deep_config = gemma3_config(layers=7, window=2, window_pattern=6)
    deep = judge.for_weights(deep_config, random_model_weights(deep_config, 0))
    assert deep.estimates_float64 and deep.naive.reads_errors and deep.naive.within is not None
    assert "each token's |error| <= 2 x the largest error any correct float64 evaluation" in deep.rule
    estimates = np.array([[1e-12, 0.5e-12, 0.0], [3e-12, 0.0, 0.0]])
    assert np.allclose(deep.tolerance(np.ones((2, 3)), estimates), [[3e-12], [7e-12]], rtol=0, atol=1e-24)
    assert judge.tolerance(np.ones((2, 3)), None) == 1e-12
    wider = Judge.for_model(adapter(dtype="float32"), FLOAT64)
    assert wider.for_weights(deep_config, random_model_weights(deep_config, 0)) is wider


def test_a_run_reports_every_rule_its_models_were_judged_by_and_the_worst_comparisons() -> None:
    """Models drawn by one run are judged by 1e-12 or by their estimate (change 59): the run counts both, and its
    rule is the one its worst comparison was held to, never merely the last model's."""
    from kvcache_conformance.run import profiles
    from kvcache_conformance.run.runner import run_machine

    result = run_machine("model", ModelReferenceAdapter(), property_id="rules", settings=profiles.settings_for(
        "ci", database=None, max_examples=20))
    assert result.failure is None, result.failure
    plain = Judge.for_model(ModelReferenceAdapter(), FLOAT64).rule
    assert len(result.rules) == 2 and result.rules[plain] > 0 and sum(result.rules.values()) == result.runs
    assert result.rule in result.rules and (result.rule == plain) == (result.worst[1] == 1e-12), result.worst


def test_a_call_outside_the_model_is_unclaimed_whatever_is_declared() -> None:
    """A shift past max_positions (docs/spec.md §15.4) has no claim: refused with any exception (changing nothing)
    or accepted (not judged), under every declaration."""
    due = Due.outside(ErrorKind.REFUSED)
    assert due.claim is None
    for capabilities in (ModelReferenceAdapter.capabilities, frozenset(), frozenset({"validates_sequence_ops"})):
        assert due.expect(capabilities) is Expect.UNCLAIMED

