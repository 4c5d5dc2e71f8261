"""``python -m ratelimit``: the ``ratelimit`` command (see :mod:`ratelimit.cli`)."""

import sys

from ratelimit.cli import main

sys.exit(main())
