"""``python -m ratelimit``: the ``ratelimit`` command (see :mod:`ratelimit.cli.command`)."""

import sys

from ratelimit.cli.command import main

sys.exit(main())
