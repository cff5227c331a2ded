"""Running the suite: which implementation (``selection``), Hypothesis profiles, known failures, example
databases, running a machine (``runner``), the report, and the pytest ``plugin`` that wires them."""
