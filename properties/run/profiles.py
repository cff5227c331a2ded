"""Hypothesis profiles, chosen by ``--hypothesis-profile`` or ``HYPOTHESIS_PROFILE``.

- ``dev`` (the default): quick feedback while developing.
- ``ci``: derandomised, so it never flakes, and without deadlines.
- ``compat``: ``ci`` with 30 examples a property, for tox's other Pythons (the
  verdicts of record are 3.11's, with ``ci``).
- ``quick``: ``ci`` with 10 examples: a smoke run, and the declaration lattice.
- ``thorough``: many examples and long programs, for a nightly or a release.
- ``replay``: only the saved examples, nothing drawn at random: the ``ci``
  profile's companion pass over a shared database (``--kv-db``), since
  Hypothesis refuses a database under ``derandomize=True``. A property with
  nothing saved is skipped ("told to run no test cases").

No profile has a deadline: a machine's run time grows with its program, and
these machines are shared and noisy.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from .databases import SHARED_OPTION, SharedExamples, SuiteDatabase

ENV_VAR = "HYPOTHESIS_PROFILE"
DEFAULT = "dev"
# No explain phase anywhere: its line tracer slows every example severalfold, and
# the machines' own failure messages already say what went wrong and where. Only
# thorough has the target phase: hill-climbing on the worst error (``target()``
# in the machines) is a search for new failures, of unpredictable length --
# often more than all the generated examples together.
_SEARCH = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_VERDICT = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
_REPLAY = (Phase.explicit, Phase.reuse)  # a shared example is already shrunk
PROFILES: dict[str, dict[str, object]] = {
    "dev": {"max_examples": 100, "stateful_step_count": 30, "phases": _VERDICT},
    "ci": {"max_examples": 100, "stateful_step_count": 30, "derandomize": True, "print_blob": True,
           "phases": _VERDICT},
    # ci with fewer examples: tox's other Pythons, which check that the suite runs and agrees there
    "compat": {"max_examples": 30, "stateful_step_count": 30, "derandomize": True, "print_blob": True,
               "phases": _VERDICT},
    # ci with ten examples: a smoke run, and every variant of the declaration lattice (tests/test_lattice.py)
    "quick": {"max_examples": 10, "stateful_step_count": 30, "derandomize": True, "print_blob": True,
              "phases": _VERDICT},
    "thorough": {"max_examples": 1000, "stateful_step_count": 80, "phases": _SEARCH},
    "replay": {"max_examples": 100, "stateful_step_count": 30, "phases": _REPLAY},
}
_COMMON: dict[str, object] = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def register(database_root: Path | None = None, implementation: str | None = None,
             shared: SharedExamples | None = None, role: str = "read") -> None:
    """(Re-)register every profile; examples go to one database per implementation, beside the
    ``shared`` one in ``role`` if given (``databases.SuiteDatabase``)."""
    for name, values in PROFILES.items():
        database: ExampleDatabase | None = None
        if database_root is not None and implementation is not None and not values.get("derandomize"):
            database = DirectoryBasedExampleDatabase(str(database_root / implementation))
            if shared is not None:
                database = SuiteDatabase(None if role == "prune" else database, shared, role)
        settings.register_profile(name, **_COMMON, **values, database=database)  # type: ignore[arg-type]


def shared_database_problem(name: str) -> str | None:
    """Why profile ``name`` cannot read a shared database, if it cannot."""
    if not PROFILES.get(name, {}).get("derandomize"):
        return None
    return (f"{SHARED_OPTION}: the {name} profile is derandomised, and Hypothesis refuses an example database under "
            f"derandomize=True. Replay the shared counterexamples in a pass of their own, which draws nothing at "
            f"random: pytest properties --hypothesis-profile replay {SHARED_OPTION} URL (docs/campaigns.md)")


def settings_for(name: str, **overrides: object) -> settings:
    """Our profile ``name`` as a settings object, without registering anything (Hypothesis has its own "ci")."""
    return settings(**{**_COMMON, **PROFILES[name], **overrides})  # type: ignore[arg-type]


def load(name: str | None = None) -> str:
    """Load ``name`` (``--hypothesis-profile``), else $HYPOTHESIS_PROFILE, else the current profile if it is
    one of ours, else dev.

    $HYPOTHESIS_PROFILE comes before the current profile because Hypothesis loads a profile of its own called
    ``ci`` whenever it sees a CI machine (the ``CI`` variable, and others): a profile the user named must win
    over that guess. With neither named, a CI machine gets our ``ci``, as Hypothesis would give it its own.
    """
    current = settings.get_current_profile_name()
    chosen = name or os.environ.get(ENV_VAR) or (current if current in PROFILES else DEFAULT)
    settings.load_profile(chosen)
    return chosen
