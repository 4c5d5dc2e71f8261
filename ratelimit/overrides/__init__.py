"""Overrides: the rules of one key replaced at run time for some callers. As the stores
keep them (:mod:`.records`), as each process caches and applies them (:mod:`.cache`),
``rl.overrides`` to set, read and delete them (:mod:`.handle`), and the calls an override
lowered below their cost (:mod:`.lowered`). Each store keeps them in its ``overrides``
module (``ratelimit/backends/*/overrides.py``).
"""

from ratelimit.overrides.cache import *  # noqa: F403 (what the module ratelimit.overrides held)
