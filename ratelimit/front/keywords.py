"""The keywords of ``limit()`` and ``concurrency()`` that give selector values: each must name
a selector of the limit's rules, when the rules are known where the limit is made.

Every keyword these methods do not name is a selector value (``user=current_user``), so a
limiter setting put there (``rl.limit("5/s", algorithm="gcra")``) or a typo (``apikye=``)
would otherwise be taken and never read: the limit would silently not be what was written.
:func:`check_selector_keywords` refuses such a keyword when the limit is made, saying
where a setting goes or which selector was meant.

Example::

    check_selector_keywords(("apikey",), {"apikye": get_key}, "limit('apikey:5/s')", LIMIT_OWN)
    # ConfigurationError: limit('apikey:5/s'): apikye= names no selector of its rules
    # (its rules' selectors: apikey); did you mean apikey=?
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from ratelimit.core.settings import SETTING_NAMES
from ratelimit.errors import ConfigurationError

LIMIT_OWN = (
    "rules", "key", "selector", "cost", "settle", "wait", "shadow", "penalty", "count_when",
    "lease",
)  # fmt: skip
"""The keywords of ``limit()`` that are not selector values."""
CONCURRENCY_OWN = ("limits", "key", "selector", "lease", "wait", "reserve", "reserve_by")
"""The keywords of ``concurrency()`` that are not selector values."""


def check_selector_keywords(
    selectors: Iterable[str], keywords: Mapping[str, object], where: str, own: Iterable[str]
) -> None:
    """Raise ``ConfigurationError`` for a keyword of ``keywords`` (given to ``where``) that
    names none of ``selectors`` (``user`` and ``user#1`` alike), saying whether it is a
    setting of the limiter or which selector it may have meant; ``own``: the method's
    keywords that are not selector values."""
    names = {name.partition("#")[0] for name in selectors}
    for keyword in keywords:
        if keyword in names:
            continue
        having = f"its rules' selectors: {', '.join(sorted(names))}" if names else "it has none"
        taken = f"{where.partition('(')[0]}() takes {', '.join(own)} and selector values"
        if keyword in SETTING_NAMES:
            raise ConfigurationError(
                f"{where}: {keyword}= is a setting of the limiter, not of one limit: give it to "
                f"RateLimit.from_url(url, {keyword}=...) or RateLimit(storage, {keyword}=...) "
                f"({taken})"
            )
        close = difflib.get_close_matches(keyword, [*names, *own], n=1)
        hint = f"did you mean {close[0]}=?" if close else taken
        raise ConfigurationError(
            f"{where}: {keyword}= names no selector of its rules ({having}); {hint}"
        )
