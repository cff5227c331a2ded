"""``python -m properties.replay TRACE.json [...]``: replay counterexample traces (``traces/replay.py``)."""

import sys

from kvcache_conformance.traces.replay import main

if __name__ == "__main__":
    sys.exit(main())
