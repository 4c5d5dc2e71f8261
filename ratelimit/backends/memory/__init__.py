"""The in-process store (``memory://``): :mod:`.backend` decides, :mod:`.entries` holds each
identifier's state, :mod:`.admit` admits the direct path's calls, and :mod:`.settles`,
:mod:`.overrides` and :mod:`.penalties` keep what those features write.
"""
