"""``python -m properties.campaign``: campaigns past one machine (``campaign/command.py``)."""

import sys

from kvcache_conformance.campaign.command import main

sys.exit(main())
