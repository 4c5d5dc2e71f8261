"""The Redis command engine (``use_scripts=False``: plain commands, no Lua): :mod:`.engine`
decides, :mod:`.decisions` and :mod:`.settles` hold each algorithm's reads and writes,
:mod:`.slots` the concurrency slots, :mod:`.lock` the lock that makes them atomic
(:mod:`.lock_tasks`: what the lock runs apart from its callers).
"""
