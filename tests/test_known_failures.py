"""``--kv-xfails FILE``: baselined properties are xfailed (strict), a rule can be left out of a machine, and a
file that baselines nothing it means to is an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcache_conformance.machines import MACHINES
from kvcache_conformance.run.known_failures import Entry, KnownFailuresError, parse

ROOT = Path(__file__).resolve().parent.parent
RULES = {name for machine in MACHINES.values() for name, spec in machine.specs().items() if spec.kind == "rule"}
SETUP = {name for machine in MACHINES.values() for name, spec in machine.specs().items()
         if spec.kind == "initialize"}

# Machine properties as the suite writes them, with a profile that does not shrink, so that it takes seconds.
MODULE = '''
from hypothesis import Phase, settings

# ci's programs, not shrunk (shrinking would take most of the time): short budgets make finding the reset bug luck
settings.register_profile("kv-known-failures-test", settings.get_profile("ci"), phases=[Phase.generate])
settings.load_profile("kv-known-failures-test")


def test_layer_without_reset(conformance):
    conformance.run("layer_cache", style="interleaved", grouped=False)


def test_layer_without_another_rule(conformance):
    conformance.run("layer_cache", style="interleaved", grouped=False)


def test_layer_known(conformance):
    conformance.run("layer_cache", style="interleaved", grouped=False)


def test_layer_judged(conformance):
    conformance.run("layer_cache", style="interleaved", grouped=False)


def test_session_known_but_fixed(conformance):
    conformance.run("session")


def test_store_without_a_rule_it_lacks(conformance):
    conformance.run("prefix_store", windowed=False)


def test_deselected(conformance):
    conformance.run("session")
'''
XFAILS = '''
# Known failures of misbehaving-reset-keeps-length
test_known_module.py::test_layer_without_reset :: reset          # reset keeps the length (#1)
test_layer_without_another_rule :: append_peaked_row               # not the culprit
test_known_module.py::test_layer_kno*                              # reset keeps the length (#1)
test_session_known_but_fixed                                       # was broken once
test_store_without_a_rule_it_lacks :: reset                        # the store machine has no reset
test_deselected                                                    # deselected by -k: no typo
test_other_module.py::test_elsewhere                               # a file this run does not collect
'''


def _pytest(tmp_path: Path, xfails: str, *arguments: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "test_known_module.py").write_text(MODULE)
    (tmp_path / "test_other_module.py").write_text("def test_elsewhere():\n    pass\n")
    (tmp_path / "xfails.txt").write_text(xfails)
    report = tmp_path / "report.json"
    process = subprocess.run(
        # --rootdir: node ids relative to the module's directory wherever the checkout is (pytest would take the
        # common ancestor of the checkout and tmp_path, /tmp for a checkout under /tmp)
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-rA", f"--rootdir={tmp_path}",
         str(tmp_path / "test_known_module.py"), f"--kv-xfails={tmp_path / 'xfails.txt'}",
         "--kv-impl=tests.misbehaving:ResetKeepsTheLength", f"--kv-report={report}",
         f"--kv-traces={tmp_path / 'traces'}", *arguments],
        cwd=ROOT, env={**os.environ, "HYPOTHESIS_PROFILE": "ci"}, capture_output=True, text=True, timeout=300)
    return process, report


@pytest.mark.slow  # six ci-profile machine runs in a subprocess (20-50 s): once, on 3.11, not on every Python
def test_known_failures_are_xfailed_rules_left_out_and_the_rest_judged(tmp_path: Path) -> None:
    process, report = _pytest(tmp_path, XFAILS, "-n", "2", "-k", "not deselected")
    output = process.stdout + process.stderr
    assert process.returncode == 1, output  # the XPASS and the failures fail the run
    document = json.loads(report.read_text())
    entries = {e["property"].split("::")[1]: e for e in document["properties"]}
    assert set(entries) == {"test_layer_without_reset", "test_layer_without_another_rule", "test_layer_known",
                            "test_layer_judged", "test_session_known_but_fixed", "test_store_without_a_rule_it_lacks"}
    assert document["complete"] is True and document["known_failures"] == str(tmp_path / "xfails.txt")

    without_reset = entries["test_layer_without_reset"]  # judged without its broken rule: it conforms
    assert without_reset["outcome"] == "passed" and without_reset["runs"] > 1
    assert without_reset["rules_left_out"] == {"reset": f"reset keeps the length (#1) (--kv-xfails "
                                                        f"{tmp_path / 'xfails.txt'}:3)"}
    other_rule = entries["test_layer_without_another_rule"]  # leaving out another rule hides nothing
    assert other_rule["outcome"] == "failed" and other_rule["rule_failed"] == "reset"
    assert list(other_rule["rules_left_out"]) == ["append_peaked_row"]
    known = entries["test_layer_known"]
    assert known["outcome"] == "xfailed" and known["reason"].startswith("known failure: reset keeps the length")
    assert known["rule_failed"] == "reset" and "reset" in known["failure"] and Path(known["trace"]).exists()
    judged = entries["test_layer_judged"]  # not in the file: still judged
    assert judged["outcome"] == "failed" and judged["rule_failed"] == "reset"
    fixed = entries["test_session_known_but_fixed"]
    assert fixed["outcome"] == "xpassed" and "remove it from the file" in fixed["reason"]
    lacking = entries["test_store_without_a_rule_it_lacks"]
    assert lacking["outcome"] == "failed" and "has no rule 'reset'" in lacking["reason"]
    assert "XPASS(strict)" in output

    causes = {(c["property"].split("::")[1], c["rule"]): c for c in document["causes"]}
    reset = [c for key, c in causes.items() if key[1] == "reset"]
    assert sum(c["failed"] for c in reset) == 2 and sum(c["known"] for c in reset) == 1
    markdown = report.with_suffix(".md").read_text()
    assert f"- known failures: `{tmp_path / 'xfails.txt'}`" in markdown
    assert "rules left out: `reset` (reset keeps the length (#1)" in markdown
    assert "| `test_known_module.py::test_session_known_but_fixed` | xpassed |" in markdown


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_entry_matching_nothing_is_an_error_and_nothing_runs(tmp_path: Path, workers: str) -> None:
    xfails = "test_known_module.py::test_layer_without_reest :: reset  # a typo\n"
    process, report = _pytest(tmp_path, xfails, "-n", workers)
    output = process.stdout + process.stderr
    assert process.returncode not in (0, 5), output
    assert f"--kv-xfails {tmp_path / 'xfails.txt'}:1: 'test_known_module.py::test_layer_without_reest' " \
           "matches no collected test (a typo?)" in output, output
    document = json.loads(report.read_text())
    assert document["complete"] is False and document["summary"]["passed"] == 0
    assert document["stopped"] and "collection" in document["stopped"]


def test_a_rule_for_a_test_without_a_machine_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "test_plain_module.py").write_text("def test_plain():\n    pass\n")
    xfails = "test_plain_module.py::test_plain :: reset  # no machine here\ntest_known_module  # all\n"
    process, _ = _pytest(tmp_path, xfails, str(tmp_path / "test_plain_module.py"), "--co")
    assert "test_plain_module.py::test_plain runs no state machine" in process.stdout + process.stderr


def test_a_malformed_file_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    process, _ = _pytest(tmp_path, "# fine\ntest_layer_known  # fine\ntest_layer_judged :: rest  # typo\n", "--co")
    assert process.returncode == pytest.ExitCode.USAGE_ERROR
    assert f"{tmp_path / 'xfails.txt'}:3: no machine has a rule 'rest'" in process.stderr


@pytest.mark.parametrize(("line", "message"), [
    ("test_x", "every entry needs a reason"),
    ("test_x  #   ", "every entry needs a reason"),
    ("test_x#no-space reason", "every entry needs a reason"),
    ("test x  # spaces", "expected PROPERTY or PROPERTY :: RULE"),
    ("test_x ::reset  # r", "expected PROPERTY or PROPERTY :: RULE"),
    ("test_x :: reset :: append_rows  # r", "expected PROPERTY or PROPERTY :: RULE"),
    ("test_x::  # r", "ends with '::'"),
    ("**  # r", "would match every test"),
    ("test_x :: build_layer_and_cache  # r", "is a machine's set-up"),
    ("test_x :: rest  # r", "no machine has a rule 'rest'"),
])
def test_malformed_lines_are_named(line: str, message: str) -> None:
    with pytest.raises(KnownFailuresError, match=r"^xfails.txt:2: ") as raised:
        parse(f"# a comment\n{line}\n", "xfails.txt", RULES, SETUP)
    assert message in str(raised.value)


def test_entries_match_node_ids_as_substrings_with_star_wildcards_and_literal_brackets() -> None:
    text = """
    # comment lines and blank lines are skipped

    properties/test_layer_cache.py::test_layer_cache_conforms[interleaved-mha] :: reset  # reset zeroes (#14)
    test_layer_cache_conforms[*-gqa]   # GQA unsupported # hash in a reason
    """
    narrowed, grouped = parse(text, "f", RULES, SETUP)
    assert narrowed == Entry("properties/test_layer_cache.py::test_layer_cache_conforms[interleaved-mha]", "reset",
                             "reset zeroes (#14)", "f:4")
    assert narrowed.file == "properties/test_layer_cache.py" and grouped.file is None
    assert grouped.reason == "GQA unsupported # hash in a reason" and grouped.rule is None
    layer = "properties/test_layer_cache.py::test_layer_cache_conforms[{}]"
    assert narrowed.matches(layer.format("interleaved-mha")) and not narrowed.matches(layer.format("half_split-mha"))
    assert grouped.matches(layer.format("half_split-gqa")) and grouped.matches(layer.format("interleaved-gqa"))
    assert not grouped.matches(layer.format("interleaved-mha"))
    assert not parse("test_i[a]  # brackets are literal", "f")[0].matches("test_i[b]")  # not a character class
    with pytest.raises(KnownFailuresError, match="f:2: repeats f:1"):
        parse("test_x  # once\ntest_x  # twice\n", "f")
