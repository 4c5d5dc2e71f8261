"""The API reference shows each setting's real default: docs/settings_defaults.py (a griffe
extension, as mkdocstrings loads it) gives the signatures of both limiters' constructors and
``from_url`` the defaults of ``Settings``, in place of the sentinel ``_UNSET`` and of
``**keywords: Unpack[SettingsKeywords]``. tests/test_docs.py checks the built site too."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from ratelimit import Settings
from tests.docs_blocks import ROOT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("griffe") is None, reason="docs extra")

SIGNATURES = [
    "front.limiter.RateLimit.__init__",
    "front.limiter.RateLimit.from_url",
    "sync.limiter.RateLimit.__init__",
    "sync.limiter.RateLimit.from_url",
]


@pytest.fixture(scope="module")
def package() -> object:
    import griffe

    extensions = griffe.load_extensions(str(ROOT / "docs" / "settings_defaults.py"))
    return griffe.load("ratelimit", search_paths=[str(ROOT)], extensions=extensions)


@pytest.mark.parametrize("where", SIGNATURES)
def test_the_reference_shows_every_setting_with_its_default(package: object, where: str) -> None:
    import griffe

    assert isinstance(package, griffe.Module)
    parameters = {p.name: p for p in package[where].parameters}
    for field in dataclasses.fields(Settings):
        if field.name == "namespace":  # an argument of its own, default None
            assert str(parameters["namespace"].default) == "None"
            continue
        parameter = parameters[field.name]
        assert parameter.kind is griffe.ParameterKind.keyword_only
        assert str(parameter.default) == repr(field.default), field.name
        assert parameter.annotation is not None
    rendered = ", ".join(f"{p.name}={p.default}" for p in parameters.values())
    assert "_UNSET" not in rendered
    assert "keywords" not in parameters
