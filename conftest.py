"""In a checkout: the suite's pytest plugin comes from the installed package (``pip install -e .``; the scripts
and tox install it), registered through its ``pytest11`` entry point. This file only makes the checkout's
own folders (``impl``, ``examples``, ``tests``, ``adapters``) importable, as pytest does for a root conftest."""
