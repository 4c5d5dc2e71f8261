"""A griffe extension for the API reference: the settings' real defaults in signatures.

``RateLimit.from_url`` (async and sync) gives each setting a sentinel default, ``_UNSET``
("not given", so that keywords given beside ``settings=`` replace only what they name), and
the constructors take the settings as ``**keywords: Unpack[SettingsKeywords]``. Rendered as
written, the reference would show ``algorithm: str = _UNSET`` and no settings at all. Here
each setting is a keyword-only parameter with the default of :class:`ratelimit.Settings`,
read from the dataclass when the site is built, so it stays true when a default changes.
tests/test_docs.py fails if the sentinel's name reaches the built reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import griffe

from ratelimit.front import limiter
from ratelimit.settings import Settings

SENTINEL = "_UNSET"
getattr(limiter, SENTINEL)  # renamed there: rename it here too (this fails the site's build)
UNPACKED = "Unpack[SettingsKeywords]"


def defaults() -> dict[str, str]:
    """Each setting's default as Python source: ``{"algorithm": "'sliding-log'", ...}``."""
    return {
        field.name: repr(field.default)
        for field in dataclasses.fields(Settings)
        if field.default is not dataclasses.MISSING
    }


def functions(obj: griffe.Object) -> list[griffe.Function]:
    """Every function and method under ``obj`` (aliases, re-exports, left out)."""
    found: list[griffe.Function] = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Function):
            found.append(member)
        elif isinstance(member, griffe.Module | griffe.Class):
            found.extend(functions(member))
    return found


class SettingsDefaults(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "ratelimit":
            return
        default = defaults()
        keywords = pkg["core.settings.SettingsKeywords"]
        for function in functions(pkg):
            parameters: list[griffe.Parameter] = []
            for parameter in function.parameters:
                if str(parameter.default) == SENTINEL:
                    parameter.default = default[parameter.name]
                if str(parameter.annotation) == UNPACKED:  # PEP 692: keyword-only parameters
                    parameters.extend(
                        griffe.Parameter(
                            name,
                            annotation=attribute.annotation,
                            kind=griffe.ParameterKind.keyword_only,
                            default=default[name],
                        )
                        for name, attribute in keywords.members.items()
                    )
                else:
                    parameters.append(parameter)
            function.parameters = griffe.Parameters(*parameters)
