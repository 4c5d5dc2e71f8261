"""The ``ratelimit`` command (also ``python -m ratelimit``): :mod:`.command` parses and
runs it, :mod:`.common` holds what its subcommands share, :mod:`.overrides` and
:mod:`.penalties` their subcommands, :mod:`.explain` what ``ratelimit check`` prints.
"""

from ratelimit.cli.command import main as main
