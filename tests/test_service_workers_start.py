"""``ratelimit serve --workers N`` that must not start, or stop as it should: memory storage,
a port in use (and one merely in TIME_WAIT, which is free), a bad worker count, a bad
rules file, the exit code after a stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ratelimit.cli.command import main as cli
from ratelimit.errors import ConfigurationError
from ratelimit.service.config import ServiceConfig
from ratelimit.service.workers import stopped_code
from tests.service_process import ROOT
from tests.supervised import DEADLINE, supervised

pytestmark = [pytest.mark.timeout(180), pytest.mark.redis, pytest.mark.once, pytest.mark.long]


def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``ratelimit serve`` with ``RATELIMIT_*`` of this test only; it must not start."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RATELIMIT_", "RATIO_"))}
    return subprocess.run(
        [sys.executable, "-m", "ratelimit", "serve", *args],
        env={**environ, "RATELIMIT_HOST": "127.0.0.1", "RATELIMIT_METRICS_PORT": "0", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_workers_on_memory_storage_are_refused() -> None:
    done = serve("--workers", "2", RATELIMIT_PORT="0")
    assert done.returncode == 3
    assert "RATELIMIT_WORKERS=2 with storage memory://" in done.stderr


def test_workers_on_a_port_in_use_are_refused(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = serve("--workers", "2", "--port", port, RATELIMIT_STORAGE=redis_url)
    assert done.returncode == 3
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "serving on" not in done.stdout


async def test_a_port_in_time_wait_is_free_for_workers(redis_url: str) -> None:
    """Connections a stopped service closed first stay in TIME_WAIT a minute; gRPC binds
    despite them (SO_REUSEADDR), and so does the supervisor's check."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: it is left in TIME_WAIT
    with socket.socket() as plain, pytest.raises(OSError, match="in use"):
        plain.bind(("127.0.0.1", port))  # held, for a bind without SO_REUSEADDR
    async with supervised(redis_url, {"RATELIMIT_PORT": str(port)}) as service:
        assert service.port == port


@pytest.mark.parametrize(
    ("args", "value"), [((), "0"), ((), "abc"), ((), "65"), (("--workers", "-1"), None)]
)
def test_a_bad_worker_count_is_named(
    args: tuple[str, ...],
    value: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if value is not None:
        monkeypatch.setenv("RATELIMIT_WORKERS", value)
    assert cli(["serve", *args]) == 3
    assert (
        f"RATELIMIT_WORKERS={value or '-1'!r}: the number of worker processes"
        in capsys.readouterr().err
    )
    with pytest.raises(ConfigurationError, match="RATELIMIT_WORKERS"):
        ServiceConfig.from_env({"RATELIMIT_WORKERS": value or "-1"})


def test_the_exit_code_after_a_stop() -> None:
    assert stopped_code([0, -signal.SIGTERM, -signal.SIGINT]) == 0
    assert stopped_code([0, -signal.SIGKILL]) == 128 + signal.SIGKILL
    assert stopped_code([0, 1]) == 1


def test_a_worker_that_cannot_start_stops_the_service_naming_it(
    redis_url: str, tmp_path: Path
) -> None:
    """The rules file is read by each worker: a bad one ends them before they listen."""
    bad = tmp_path / "rules.toml"
    bad.write_text('[[limit]]\ndomain = "gw"\n')  # no descriptor
    done = serve("--workers", "2", RATELIMIT_PORT="0", RATELIMIT_STORAGE=redis_url,
                 RATELIMIT_RULES_FILE=str(bad))  # fmt: skip
    assert done.returncode == 3
    assert re.search(r"cannot start: worker \d exited with 3 before it listened", done.stderr)
    assert "serving on" not in done.stdout
