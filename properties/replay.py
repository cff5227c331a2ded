"""``python -m properties.replay TRACE.json [...]`` in a clone, ``python -m kvcache_conformance.replay`` installed:
replay counterexample traces (``traces/replay.py``)."""

import sys

from kvcache_conformance.traces.replay import main

if __name__ == "__main__":
    sys.exit(main())
