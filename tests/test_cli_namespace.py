"""The ``ratelimit`` command reads the library's namespace by default (``""``), says which
namespace it read and when it found nothing there; ``check`` says what a tree means in
words; ``serve`` without its extra says so once."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest

from ratelimit import RateLimit
from ratelimit.cli.command import main as cli
from ratelimit.cli.command import parser
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_namespace_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RATELIMIT_NAMESPACE", raising=False)
    monkeypatch.delenv("RATELIMIT_ALGORITHM", raising=False)
    monkeypatch.delenv("RATELIMIT_STORAGE", raising=False)


def test_the_namespace_defaults_to_the_librarys(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for command in (["peek", "--key", "k", "1/m"], ["reset", "--key", "k", "1/m"],
                    ["override", "list"]):  # fmt: skip
        assert parser().parse_args(command).namespace == ""
    for command in (["peek", "--help"], ["override", "--help"]):
        with pytest.raises(SystemExit):
            cli(command)
        help_text = " ".join(capsys.readouterr().out.split())
        assert '(default: "", the library\'s default; $RATELIMIT_NAMESPACE overrides)' in (
            help_text
        )
    monkeypatch.setenv("RATELIMIT_NAMESPACE", "shop")
    assert parser().parse_args(["override", "list"]).namespace == "shop"
    assert parser().parse_args(["peek", "--key", "k", "1/m"]).namespace == "shop"


@pytest.mark.redis
def test_peek_and_reset_see_what_the_library_counted_by_default(
    capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    key = f"search-{uuid.uuid4().hex[:8]}"

    async def five_calls() -> None:
        async with RateLimit.from_url(redis_url) as rl:  # the library's default namespace
            limit = rl.limit("user:5/m", key=key, user="ann")
            assert [(await limit.decide()).allowed for _ in range(5)] == [True] * 5

    asyncio.run(five_calls())
    store = ["--storage", redis_url, "--key", key, "user:5/m", "user=ann"]
    assert cli(["peek", *store]) == 1  # refused: the five calls are seen
    out = capsys.readouterr().out
    assert out.startswith(f"namespace '', key {key!r}, user='ann'\n")
    assert "would be refused by user:5/m" in out
    assert "nothing counted" not in out

    assert cli(["peek", *store, "--namespace", "ratelimit"]) == 0  # the old default
    out = capsys.readouterr().out
    assert (
        f"nothing counted for key {key!r} and user='ann' in namespace 'ratelimit' (is the "
        "namespace right? the library's default is ''; is the key? a decorated function's "
        "is its module.qualname, a block's without key= where it was made, "
        "module.qualname:line:column, as Decision.key shows)\n"
    ) in out
    assert cli(["reset", *store, "--namespace", "ratelimit"]) == 0
    assert capsys.readouterr().out.startswith(
        f"reset: nothing counted for key {key!r} and user='ann' in namespace 'ratelimit' ("
    )

    assert cli(["reset", *store]) == 0
    assert capsys.readouterr().out == f"reset: {key!r} for user='ann' in namespace ''\n"
    assert cli(["peek", *store]) == 0  # the reset took: admitted, and nothing counted
    out = capsys.readouterr().out
    assert "would be admitted: 4 left after it" in out
    assert (
        f"nothing counted for key {key!r} and user='ann' in namespace '' (is the namespace "
        "right? '' is the library's default, unless RateLimit(..., namespace=...) set another"
    ) in out


@pytest.mark.redis
def test_override_commands_name_the_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    with RedisServer() as server:  # a store of its own: namespace '' holds nothing yet
        store = ["--storage", server.url]
        assert cli(["override", "list", *store]) == 0
        assert capsys.readouterr().out == (
            "no overrides in namespace '' (is the namespace right? '' is the library's "
            "default, unless RateLimit(..., namespace=...) set another)\n"
        )
        assert cli(["override", "list", *store, "--key", "search", "--namespace", "shop"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("no overrides of key 'search' in namespace 'shop'")
        assert cli(["override", "get", *store, "--key", "search", "apikey=abc"]) == 1
        assert capsys.readouterr().out == (
            "no override of 'search' for apikey='abc' in namespace ''\n"
        )
        assert cli(["override", "delete", *store, "--key", "search", "--namespace", "shop"]) == 1
        assert (
            capsys.readouterr().out
            == "none was set: 'search' for every caller in namespace 'shop'\n"
        )


def test_check_says_what_a_tree_means(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["check", "apikey:100/h & (10/s | 15/m)"]) == 0
    assert capsys.readouterr().out == (
        "apikey:100/h & (10/s | 15/m)\n"
        "  refused only when both: more than 100 calls per hour for one apikey, and "
        "(more than 10 per second or more than 15 per minute, every call of the key)\n"
        "  on a Redis Cluster: each apikey's counters in a slot of their own, the whole key's "
        "in the key's own: a call spans 2 slots, decided by parts\n"
    )
    assert cli(["check", "user:5/m & 100/h"]) == 0  # a rule on the command line, quoted
    assert capsys.readouterr().out.splitlines()[1] == (
        "  refused only when both: more than 5 calls per minute for one user, and more than "
        "100 calls per hour for the whole key"
    )


def test_check_says_what_each_limit_of_a_rules_file_means(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(["check", str(ROOT / "examples" / "service_rules.toml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == [
        "  line 4: edge [remote_address]: 100/m | 1000/h",
        "    refused when either: more than 100 calls per minute for one descriptor "
        "[remote_address], or more than 1000 calls per hour for one descriptor "
        "[remote_address]",
    ]
    assert lines[4] == (
        "    refused when: more than 2 calls per minute for one descriptor "
        "[path=/login, remote_address]"
    )


def test_serve_without_its_extra_says_so_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes importing grpc fail as if it were not installed
    monkeypatch.setitem(sys.modules, "grpc", None)
    monkeypatch.delitem(sys.modules, "ratelimit.service.server", raising=False)
    assert cli(["serve"]) == 3
    err = capsys.readouterr().err
    assert err.count("pip install") == 1, err
    assert err == (
        "the rate-limit service (ratelimit serve) needs the 'server' extra: "
        "pip install 'ratelimit-rules[server]' (missing module 'grpc')\n"
    )


def test_the_service_page_shows_what_check_prints(capsys: pytest.CaptureFixture[str]) -> None:
    page = (ROOT / "docs" / "service.md").read_text()
    shown = page.split("$ ratelimit check ", 1)[1].split("```", 1)[0].splitlines()
    assert cli(["check", shown[0].strip('"')]) == 0
    assert capsys.readouterr().out.splitlines() == shown[1:]


@pytest.mark.redis
def test_peek_says_when_no_rule_can_refuse(
    capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    # a selector given no value counts nothing: never "None left after it (rule None)"
    store = ["--storage", redis_url, "--namespace", f"peek-{uuid.uuid4().hex[:8]}"]
    for rules in ("user:5/m", "user:5/m & 10/h"):
        assert cli(["peek", *store, "--key", "search", rules, "user="]) == 0
        out = capsys.readouterr().out
        assert (
            "would be admitted, and no rule can refuse these values (a selector without a "
            "value counts nothing, and & refuses only when every side would)\n"
        ) in out
        assert "None" not in out
