"""Install llama-cpp-python 0.3.36 into this interpreter from a wheel built once and cached.

PyPI has only its sdist: building it (vendored llama.cpp, CPU, OpenMP) took 46 min of wall time niced on a loaded
2-core machine (808 s of user CPU), so the wheel is kept in ~/.cache/kvcache-conformance/wheels and reused.
Run by tox -e llamacpp before its commands; by hand: python scripts/llama-wheel.py
"""

import os
import subprocess
import sys
from pathlib import Path

VERSION = "0.3.36"
WHEELS = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvcache-conformance" / "wheels"
# Only the library: no tools, tests, examples or server (each adds minutes to the build).
CMAKE_ARGS = ("-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF "
              "-DLLAMA_BUILD_SERVER=OFF")


def main() -> int:
    WHEELS.mkdir(parents=True, exist_ok=True)
    wheel = next(WHEELS.glob(f"llama_cpp_python-{VERSION}-*.whl"), None)
    if wheel is None:
        print(f"building llama-cpp-python {VERSION} from its sdist into {WHEELS} (once; minutes)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary", "llama-cpp-python",
                        f"llama-cpp-python=={VERSION}", "-w", str(WHEELS)], check=True,
                       env={**os.environ, "CMAKE_ARGS": CMAKE_ARGS,
                            "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)})
        wheel = next(WHEELS.glob(f"llama_cpp_python-{VERSION}-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
