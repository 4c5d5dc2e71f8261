"""``ratelimit penalties list|lift`` on a real Redis and PostgreSQL: the holds other
processes started."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest

from ratelimit import RateLimit
from ratelimit.cli.command import main
from ratelimit.cli.common import INVALID, OK, REFUSED


async def _hold(url: str, namespace: str) -> None:
    algorithm = "sliding-window" if url.startswith("postgres") else "sliding-log"
    rl = RateLimit.from_url(url, namespace=namespace, algorithm=algorithm)
    for ip in ("198.51.100.1", "198.51.100.2"):
        limit = rl.limit("ip:1/h", key="login", ip=ip, penalty="2 refusals/m for 1h")
        for _ in range(3):
            await limit.decide()
    whole = rl.limit("1/h", key="export", penalty="2 refusals/m for 10m")
    for _ in range(3):
        await whole.decide()
    await rl.aclose()


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("redis_url", marks=pytest.mark.redis),
        pytest.param("postgres_url", marks=pytest.mark.postgres),
    ],
)
def test_list_and_lift(
    request: pytest.FixtureRequest, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    url = request.getfixturevalue(url)
    store = ["--storage", url, "--namespace", namespace]
    asyncio.run(_hold(url, namespace))
    assert main(["penalties", "list", *store]) == OK
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"3 holds in namespace {namespace!r}:"
    assert re.fullmatch(r"'export' \(whole key\): (9m5\d|10m00)s left", out[1]), out
    assert re.fullmatch(r"'login' ip=198\.51\.100\.1: (59m5\d|1h00m00)s left", out[2]), out
    assert out[3].startswith("'login' ip=198.51.100.2: ")
    assert main(["penalties", "lift", "login", "ip=198.51.100.1", *store]) == OK
    assert "lifted 1 hold of 'login' for ip='198.51.100.1'" in capsys.readouterr().out
    assert main(["penalties", "list", "--key", "login", *store]) == OK
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"1 hold of key 'login' in namespace {namespace!r}:"
    assert out[1].startswith("'login' ip=198.51.100.2")
    assert main(["penalties", "lift", "login", *store]) == OK
    assert main(["penalties", "lift", "login", *store]) == REFUSED  # none left
    assert main(["penalties", "lift", "export", *store]) == OK
    capsys.readouterr()
    assert main(["penalties", "list", *store]) == OK
    assert capsys.readouterr().out.startswith("no holds in namespace")


def test_memory_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["penalties", "list", "--storage", "memory://"]) == INVALID
    assert "memory:// keeps penalties in the process" in capsys.readouterr().err


def test_bad_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["penalties", "lift", "--storage", "memory://"])
    assert "takes the key" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["penalties", "list", "login", "--storage", "memory://"])
    assert "--key at most" in capsys.readouterr().err
