"""The ``ratelimit`` command: what it says of odd input, and the flags the README names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ratelimit.cli.command import main as cli
from ratelimit.service.config import ServiceConfig

ROOT = Path(__file__).resolve().parent.parent


def test_check_takes_a_rule_too_long_for_a_file_name(capsys: pytest.CaptureFixture[str]) -> None:
    # a limits-style rule of 389 characters, longer than any file name may be (255)
    rule = ";".join(f"{n} per {unit}" for n in range(1000, 1048) for unit in ["day"])
    assert len(rule) > 300
    assert cli(["check", rule]) == 0  # read as rules, never tried as a file name
    assert (
        "more than 1000 calls per day for the whole key, more than 1001" in capsys.readouterr().out
    )
    long_and_valid = " | ".join(f"user:{n}/h" for n in range(100, 140))
    assert len(long_and_valid) > 255
    assert cli(["check", long_and_valid]) == 0
    assert "any of: more than 100 calls per hour for one user, more than 101" in (
        capsys.readouterr().out
    )
    assert cli(["check", "1/s\x00"]) == 1  # a NUL byte is no file name either


def test_serve_takes_the_algorithm_the_readme_names(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ServiceConfig] = []

    async def serve(config: ServiceConfig) -> None:
        seen.append(config)

    monkeypatch.setattr("ratelimit.service.server.serve", serve)
    monkeypatch.delenv("RATELIMIT_ALGORITHM", raising=False)
    assert cli(["serve", "--algorithm", "gcra"]) == 0
    assert [config.algorithm for config in seen] == ["gcra"]
    with pytest.raises(SystemExit) as usage:
        cli(["serve", "--algorithm", "leaky-bucket"])
    assert usage.value.code == 2


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("from ratelimit.asgi import RouteLimit", "starlette", "asgi"),
        ("import ratelimit.metrics.opentelemetry", "opentelemetry", "otel"),
        ("import ratelimit.service.server", "grpc", "server"),
        ("import ratelimit.service.handlers", "google.protobuf", "server"),
    ],
)
def test_a_missing_extra_is_named(module: str, missing: str, extra: str) -> None:
    # None in sys.modules makes importing that module fail as if it were not installed
    code = f"import sys; sys.modules[{missing!r}] = None\n{module}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError:")
    assert f"pip install 'ratelimit-rules[{extra}]'" in last
    assert f"missing module '{missing}" in last


def test_override_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # memory:// lives as long as one command: no process would ever see what it writes
    for command in (
        ["override", "set", "--key", "search", "apikey=abc", "apikey:1000/h"],
        ["override", "get", "--key", "search", "apikey=abc"],
        ["override", "delete", "--key", "search", "apikey=abc"],
        ["override", "list"],
        ["peek", "--key", "search", "apikey:5/h", "apikey=abc"],
        ["reset", "--key", "search", "apikey:5/h", "apikey=abc"],
    ):
        assert cli(command) == 1, command
        out, err = capsys.readouterr()
        assert out == "", command  # never "set:" into a store that vanishes
        assert "invalid: memory:// keeps" in err
        assert "pass --storage (or set RATELIMIT_STORAGE)" in err
    assert cli(["override", "set", "--key", "search", "apikey:10/"]) == 1  # its syntax first
    assert cli(["override", "set", "--key", "s", "10/m", "--storage", "redis://127.0.0.1:1"]) == 3
    for usage in (
        ["override", "set", "--key", "search", "apikey=abc"],  # no rules
        ["override", "get", "--key", "search", "10/m"],  # rules where none go
        ["override", "get", "apikey=abc"],  # no key
        ["override", "list", "apikey=abc"],
        ["override", "get", "--key", "k", "--ttl", "5"],
        ["override", "set", "--key", "k", "10/m", "--bogus"],
    ):
        with pytest.raises(SystemExit) as exited:
            cli(usage)
        assert exited.value.code == 2, usage


@pytest.mark.redis
def test_override_commands_on_redis_and_peek_shows_the_rules_in_force(
    capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    store = ["--storage", redis_url, "--namespace", "cli-overrides"]
    assert cli(["override", "set", *store, "--key", "search", "apikey:10/m burst 3"]) == 1
    assert "burst" in capsys.readouterr().err
    assert cli(["override", "get", *store, "--key", "never-set", "apikey=abc"]) == 1
    capsys.readouterr()
    set_ = ["override", "set", *store, "--key", "search", "apikey=abc", "apikey:9/h"]
    assert cli([*set_, "--ttl", "3600"]) == 0
    assert "until" in capsys.readouterr().out
    assert cli(["override", "get", *store, "--key", "search", "apikey=abc"]) == 0
    assert "search [apikey=abc]: apikey:9/h, until" in capsys.readouterr().out
    assert cli(["override", "list", *store]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # the namespace, the override
    assert cli(["peek", *store, "--key", "search", "apikey:5/h", "apikey=abc"]) == 0
    out = capsys.readouterr().out
    assert "rules in force: apikey:9/h (override of apikey='abc', until" in out
    assert "8 left" in out
    assert cli(["peek", *store, "--key", "search", "apikey:5/h", "apikey=xyz"]) == 0
    assert "rules in force: apikey:5/h (the limit's own)" in capsys.readouterr().out
    assert cli(["override", "delete", *store, "--key", "search", "apikey=abc"]) == 0
    assert cli(["override", "list", *store]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "deleted: 'search' for apikey='abc' in namespace 'cli-overrides'",
        "no overrides in namespace 'cli-overrides' (is the namespace right? the library's "
        "default is '')",
    ]


async def test_the_commands_wait_for_a_far_redis_longer_than_a_request_would() -> None:
    """An operator's command is no request path: on Redis it waits COMMAND_TIMEOUT for
    each store call, not the limiter's 0.25 s (a busy or far Redis failed overrides get)."""
    import argparse

    from ratelimit.cli.common import COMMAND_TIMEOUT, limiter_of

    args = argparse.Namespace(namespace="", spread="auto", algorithm=None)
    rl = limiter_of(args, "redis://127.0.0.1:1/0")
    try:
        assert COMMAND_TIMEOUT >= 5
        assert getattr(rl.storage, "timeout", None) == COMMAND_TIMEOUT
    finally:
        await rl.aclose()
