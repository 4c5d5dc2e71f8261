"""The in-process store (``memory://``): :mod:`.backend` holds the dicts and the lock, and a
module per feature holds what the store does for it (:mod:`.decisions`, :mod:`.settles`,
:mod:`.resets`, :mod:`.slots`, :mod:`.overrides`, :mod:`.penalties`), each a mixin of
:class:`~.backend.MemoryBackend`; :mod:`.entries` holds each identifier's state, and
:mod:`.admit` admits the direct path's calls.
"""

from ratelimit.backends.memory.backend import MemoryBackend as MemoryBackend
