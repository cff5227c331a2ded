"""Proof that the suite works as a third party installs it (tox -e install).

Builds the sdist and, from it, the wheel; installs the wheel into a fresh
venv; then, from an empty temporary directory holding only a copy of
examples/minimal_adapter.py (and a broken variant of it):

1. ``pytest --pyargs kvcache_conformance`` passes the example;
2. ``kvcache-conformance run`` passes it too, and says where the report went;
3. ``-x`` against the broken variant fails, writing its trace, example
   database and report under the directory it ran from;
4. ``kvcache-conformance replay`` of that trace diverges against the broken
   variant (exit 1) and conforms against the example (exit 0);
5. a pytest run of an unrelated project in the same venv is untouched by the
   plugin;
6. nothing was written into site-packages but bytecode caches (``__pycache__``: Python's, and pytest's
   assertion rewriting, which caches every plugin's modules there, Hypothesis's and xdist's too).

It runs as a third party would: without ``PYTHONDONTWRITEBYTECODE``.

It prints the wheel's size and what the install pulled in. Everything it
starts is a child process it waits for; the temporary directories go at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROKEN = '''from minimal_adapter import MinimalAdapter


class Broken(MinimalAdapter):
    name = "example-minimal-broken"

    def step(self, layer, cache, x):
        return super().step(layer, cache, x) + 1e-6  # off by 1e-6 at every step


def make_adapter():
    return Broken()
'''
UNRELATED = '''def test_something_else():
    assert 1 + 1 == 2
'''


def run(*command: str | Path, cwd: Path, expect: int | tuple[int, ...] = 0, env: dict[str, str] | None = None,
        timeout: float = 900) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as a third party runs
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={**inherited, **(env or {})})
    wanted = (expect,) if isinstance(expect, int) else expect
    shown = " ".join(str(c) for c in command[-6:])
    print(f"  [{time.monotonic() - started:5.1f} s] exit {result.returncode}: ...{shown}")
    if result.returncode not in wanted:
        sys.stdout.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"install check: expected exit {wanted}, got {result.returncode}")
    return result


def files_of(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file but bytecode caches, with its size and modification time."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def main() -> int:
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kvcache-install-"))
    try:
        print("build: sdist, then the wheel from it")
        dist = work / "dist"
        run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=work)
        wheel = next(dist.glob("*.whl"))
        sdist = next(dist.glob("*.tar.gz"))
        print(f"  wheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB; "
              f"sdist {sdist.stat().st_size / 1024:.0f} KiB")

        print("install into a fresh venv")
        venv = work / "venv"
        run(sys.executable, "-m", "venv", venv, cwd=work)
        python, bin_dir = venv / "bin" / "python", venv / "bin"
        run(python, "-m", "pip", "install", "--quiet", wheel, cwd=work, timeout=1200)
        pulled = run(python, "-m", "pip", "list", "--format=json", cwd=work).stdout
        print("  installed: " + ", ".join(f"{p['name']} {p['version']}" for p in json.loads(pulled)))
        site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                        cwd=work).stdout.strip())
        top = sorted(p.name for p in site.iterdir() if "kvcache" in p.name.lower())
        print(f"  in site-packages: {top}")
        assert not any((site / name).exists() for name in ("impl", "oracle", "properties", "adapters")), \
            "generic top-level names installed"
        before = files_of(site)

        here = work / "project"
        here.mkdir()
        shutil.copy(ROOT / "examples" / "minimal_adapter.py", here)
        (here / "broken_adapter.py").write_text(BROKEN)
        quick = {"HYPOTHESIS_PROFILE": "quick", "PYTHONPATH": str(here)}

        print("1. pytest --pyargs, the example adapter")
        run(bin_dir / "pytest", "--pyargs", "kvcache_conformance", "-n", "2", "-p", "no:cacheprovider",
            "--kv-impl", "minimal_adapter:make_adapter", cwd=here, env=quick)

        print("2. the console command")
        out = run(bin_dir / "kvcache-conformance", "run", "--impl", "minimal_adapter:make_adapter", "-n", "2",
                  cwd=here, env={"HYPOTHESIS_PROFILE": "quick"}).stdout
        assert "kvcache-conformance: report" in out and (here / "kvcache-report.json").exists(), out[-2000:]
        assert "PytestAssertRewriteWarning" not in out, out[-2000:]
        report = json.loads((here / "kvcache-report.json").read_text())
        assert report["summary"]["failed"] == 0 and report["summary"]["passed"] > 0, report["summary"]
        names = {entry["property"] for entry in report["properties"]}
        assert "properties/test_layer_cache.py::test_layer_cache_conforms" in names, sorted(names)[:5]

        print("3. -x against a broken adapter: outputs under the directory it ran from")
        run(bin_dir / "kvcache-conformance", "run", "--impl", "broken_adapter:make_adapter", "-x",
            "-k", "not test_trace_replays", "--kv-report=broken.json", cwd=here, env={"HYPOTHESIS_PROFILE": "dev"},
            expect=1)
        traces = sorted((here / "counterexamples").glob("*.json"))
        assert traces, "no trace written under the directory the suite ran from"
        assert (here / ".hypothesis" / "implementations" / "example-minimal-broken").is_dir()
        assert (here / "broken.json").exists() and (here / "broken.md").exists()

        print("4. replay the trace (the adapter found in the current directory, as run finds it)")
        run(bin_dir / "kvcache-conformance", "replay", traces[0], "--kv-impl", "broken_adapter:make_adapter",
            cwd=here, env={"PYTHONPATH": ""}, expect=1)
        run(bin_dir / "kvcache-conformance", "replay", traces[0], "--kv-impl", "minimal_adapter:make_adapter",
            cwd=here, env={"PYTHONPATH": ""})

        print("5. an unrelated project's tests, the plugin installed")
        other = work / "other"
        other.mkdir()
        (other / "test_other.py").write_text(UNRELATED)
        out = run(bin_dir / "pytest", "-p", "no:cacheprovider", cwd=other,
                  env={"KVCACHE_IMPL": "", "HYPOTHESIS_PROFILE": ""}).stdout
        assert "kvcache implementation" not in out and "1 passed" in out, out

        print("6. nothing written into site-packages (bytecode caches aside)")
        after = files_of(site)
        changed = sorted(set(after) ^ set(before) | {p for p in before if p in after and after[p] != before[p]})
        assert not changed, f"written into site-packages: {changed[:10]}"
        print(f"install check passed in {time.monotonic() - began:.0f} s")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
