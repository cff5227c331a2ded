"""Selecting an implementation: KVCACHE_IMPL / --kv-impl, clear load errors, capabilities, databases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from examples.minimal_adapter import make_adapter
from kvcache_conformance.machines.layer import LayerCacheMachine
from kvcache_conformance.run import profiles, selection

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("spec, complaint", [
    ("no_colon_here", "expected 'package.module:factory'"),
    ("no.such.module:make_adapter", "cannot import module 'no.such.module'"),
    ("impl.conformance:no_such_factory", "has no callable 'no_such_factory'"),
    ("impl.errors:KvCacheError", "the adapter lacks"),
])
def test_a_bad_spec_names_the_variable_and_the_problem(spec: str, complaint: str) -> None:
    with pytest.raises(selection.AdapterLoadError) as failure:
        selection.load_adapter(spec)
    assert "KVCACHE_IMPL" in str(failure.value) and "--kv-impl" in str(failure.value)
    assert complaint in str(failure.value)


def test_an_adapter_module_in_the_current_directory_is_found_but_never_shadows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as `python -m pytest` finds it; the bare `pytest` / `kvcache-conformance` commands do not put "." on the path
    (tmp_path / "adapter_next_door.py").write_text(
        "from examples.minimal_adapter import make_adapter as make\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert selection.load_adapter("adapter_next_door:make").name == "example-minimal"
    assert sys.path[-1] == str(tmp_path)  # last: an installed module of the same name wins
    with pytest.raises(selection.AdapterLoadError, match="cannot import module 'not_next_door'"):
        selection.load_adapter("not_next_door:make")


def test_option_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(selection.ENV_VAR, "examples.minimal_adapter:make_adapter")
    assert selection.spec_from(None) == "examples.minimal_adapter:make_adapter"
    assert selection.spec_from("impl.conformance:make_adapter") == "impl.conformance:make_adapter"
    monkeypatch.delenv(selection.ENV_VAR)
    assert selection.spec_from(None) == selection.DEFAULT_SPEC


def test_each_implementation_gets_its_own_example_database(tmp_path: Path) -> None:
    current = settings.get_current_profile_name()
    try:
        profiles.register(tmp_path, selection.database_key(make_adapter()))
        database = settings.get_profile("dev").database
        assert Path(database.path) == tmp_path / "example-minimal"  # type: ignore[union-attr]
        assert settings.get_profile("ci").database is None  # derandomised: nothing to save
    finally:
        profiles.register(ROOT / ".hypothesis" / "implementations", selection.database_key(selection.selected()))
        profiles.load(current)


def test_a_named_profile_wins_over_the_one_hypothesis_guesses_on_a_ci_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    current = settings.get_current_profile_name()
    try:
        settings.load_profile("ci")  # what Hypothesis does at import when it sees CI=true
        monkeypatch.setenv(profiles.ENV_VAR, "dev")
        assert profiles.load() == "dev"
        assert profiles.load("quick") == "quick"  # --hypothesis-profile wins over the variable
        monkeypatch.delenv(profiles.ENV_VAR)
        settings.load_profile("ci")
        assert profiles.load() == "ci"  # nothing named: a CI machine gets our ci
        settings.load_profile("default")
        assert profiles.load() == profiles.DEFAULT
    finally:
        profiles.load(current)


def test_on_a_ci_machine_the_run_uses_the_profile_named_in_the_environment() -> None:
    environment = {**os.environ, "CI": "true", "HYPOTHESIS_PROFILE": "dev"}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:randomly",
                          "properties/test_layer_cache.py"], cwd=ROOT, env=environment, capture_output=True,
                         text=True, timeout=300).stdout
    assert "kvcache hypothesis profile: dev " in out, out[-2000:]


def test_the_minimal_example_adapter_conforms_to_what_it_claims() -> None:
    ci = settings(settings.get_profile("ci"), database=None)
    run_state_machine_as_test(lambda: LayerCacheMachine(make_adapter(), style="interleaved", grouped=False),
                              settings=ci)


@pytest.mark.slow
def test_the_suite_runs_a_third_party_adapter_under_xdist() -> None:
    """End to end, as a user runs it: the header names the implementation, absent capabilities skip."""
    environment = {**os.environ, "KVCACHE_IMPL": "examples.minimal_adapter:make_adapter", "HYPOTHESIS_PROFILE": "ci"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-rs", "properties"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "kvcache implementation: example-minimal 1.0" in result.stdout
    assert "kvcache capabilities: float64, rope_interleaved" in result.stdout
    assert "does not declare prefix_store" in result.stdout
    assert "does not declare creation_errors" in result.stdout


def test_an_unloadable_implementation_stops_the_run_with_a_usage_error() -> None:
    environment = {**os.environ, "KVCACHE_IMPL": "no.such.module:make_adapter"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "properties"],
                            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert "KVCACHE_IMPL" in result.stderr and "no.such.module" in result.stderr


def test_the_no_rope_example_adapter_conforms_to_what_it_claims() -> None:
    from examples.no_rope_adapter import make_adapter as no_rope_adapter

    ci = settings(settings.get_profile("ci"), database=None)
    run_state_machine_as_test(lambda: LayerCacheMachine(no_rope_adapter(), style="none", grouped=False),
                              settings=ci)


@pytest.mark.slow
def test_a_no_rope_adapter_runs_every_property_that_applies() -> None:
    """No property may crash for lack of a RoPE style: only positionless layers are drawn, and what needs RoPE
    skips."""
    environment = {**os.environ, "KVCACHE_IMPL": "examples.no_rope_adapter:make_adapter", "HYPOTHESIS_PROFILE": "ci"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "properties/test_precision.py",
         "properties/test_layer_cache.py", "properties/test_cache_creation.py"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "test_layer_cache_conforms PASSED" in result.stdout
    assert "test_capacity_is_bounded_by_rope_positions SKIPPED" in result.stdout
    assert "test_implementation_agrees_with_mpmath PASSED" in result.stdout


class PagedOnly:
    """A serving engine's adapter: a paged pool over a decoder, no layer caches."""

    name, version = "test-paged-only", "1"
    capabilities = frozenset({"float64", "paged_prefix_sharing", "positions_rope"})
    lacking = frozenset({"create_layer", "step", "snapshot", "create_cache", "truncate"})

    def __getattr__(self, name: str) -> object:
        from impl.conformance import ReferenceAdapter

        if name in self.lacking:
            raise AttributeError(name)
        return getattr(ReferenceAdapter(), name)


class DeclaresTruncateWithoutIt(PagedOnly):
    capabilities = PagedOnly.capabilities | {"truncate"}
    lacking = frozenset({"truncate"})


def test_what_an_adapter_must_have_follows_what_it_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layer-cache methods only for an adapter that drives layers; each operation's method only if declared."""
    module = type(sys)("kv_test_declared_methods")
    module.paged_only, module.declares_truncate = PagedOnly, DeclaresTruncateWithoutIt  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kv_test_declared_methods", module)
    assert selection.load_adapter("kv_test_declared_methods:paged_only").name == "test-paged-only"
    with pytest.raises(selection.AdapterLoadError) as failure:
        selection.load_adapter("kv_test_declared_methods:declares_truncate")
    assert "lacks truncate," in str(failure.value)
