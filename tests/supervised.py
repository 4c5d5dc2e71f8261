"""``ratelimit serve --workers N`` for the tests: the supervisor as a process on Redis, its
workers' pids, what its ``/metrics`` sums and what each worker counted, and client processes
(:mod:`tests.workers_client`) to drive it.

Which worker answered is read where the supervisor's ``/metrics`` reads it: each worker
writes its metrics to files of its own pid (``counter_<pid>.db``) in the supervisor's
directory, which ``/metrics`` sums; a worker's own file is its own count."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import httpx
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.service_process import ROOT, ServiceProcess

T = TypeVar("T")
DEADLINE = 60.0
"""How long any one wait of these tests may take: generous, never asserted on."""


@asynccontextmanager
async def supervised(
    redis_url: str, env: dict[str, str] | None = None
) -> AsyncIterator[ServiceProcess]:
    """``ratelimit serve --workers 2`` on Redis under a namespace of its own; stopped, with
    every worker it had, at the end."""
    service = ServiceProcess(
        {
            "RATELIMIT_STORAGE": redis_url,
            "RATELIMIT_WORKERS": "2",
            "RATELIMIT_NAMESPACE": f"workers-{uuid.uuid4().hex[:12]}",
            "RATELIMIT_TIMEOUT": "10s",
            **(env or {}),
        }
    )
    seen: set[int] = set()
    try:
        await asyncio.to_thread(service.start, DEADLINE)
        seen.update(await workers(service))
        yield service
    finally:
        process = service.process
        if process is not None and process.poll() is None:
            seen.update(children(process.pid))
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, DEADLINE)
            except subprocess.TimeoutExpired:
                process.kill()
        for pid in seen:  # a worker left without its supervisor, and only ours
            if is_worker(pid):
                os.kill(pid, signal.SIGKILL)
        # only then: a worker left holds the output's pipe open, which reading waits on
        await asyncio.to_thread(service.stop)


def is_worker(pid: int) -> bool:
    """Whether ``pid`` is a live worker of a supervisor (not a pid used again since)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"RATELIMIT_WORKER=" in environ and state != "Z"


def children(pid: int) -> set[int]:
    """The processes ``pid`` started, as Linux lists them."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            listed = (task / "children").read_text()
        except FileNotFoundError:  # a thread that ended since the listing: it has none
            continue
        found.update(int(child) for child in listed.split())
    return found


async def workers(service: ServiceProcess, unlike: frozenset[int] = frozenset()) -> set[int]:
    """The supervisor's two worker pids, once it has two and none of them is in ``unlike``."""
    assert service.process is not None
    supervisor = service.process.pid

    async def two() -> set[int] | None:
        found = children(supervisor)
        return found if len(found) == 2 and not found & unlike else None

    return await wait_for(two)


async def wait_for(condition: Callable[[], Awaitable[T | None]], within: float = DEADLINE) -> T:
    """What ``condition()`` gives once it is not ``None``, asked for ``within`` seconds."""
    deadline = time.monotonic() + within
    while (found := await condition()) is None:
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)  # polling other processes, not waiting for a window
    return found


async def scrape(service: ServiceProcess) -> list[Sample]:
    """The samples the supervisor's ``/metrics`` serves: the workers' sums."""
    found = re.search(r"metrics on (http://\S+/metrics)", service.output)
    assert found, service.output
    async with httpx.AsyncClient(timeout=DEADLINE) as http:
        text = (await http.get(found.group(1))).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def of_worker(pid: int) -> list[Sample]:
    """The counters worker ``pid`` wrote (its own file in the supervisor's directory)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    folder = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC"))
    path = Path(os.fsdecode(folder)) / f"counter_{pid}.db"
    if not path.exists():  # a worker still starting
        return []
    merged = MultiProcessCollector.merge([str(path)], accumulate=True)  # type: ignore[no-untyped-call]
    return [sample for metric in merged for sample in metric.samples]


def total(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


# --- client processes and channels ---

Client = asyncio.subprocess.Process


async def clients(
    started: list[Client], address: str, count: int, channels: int, calls: int, owner: str
) -> None:
    """``count`` client processes (:mod:`tests.workers_client`) added to ``started``, each
    with ``channels`` connections; returns once every one is connected."""
    for _ in range(count):
        started.append(
            await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "tests.workers_client", address),
                *(str(channels), str(calls), owner),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        )
    for client in started:
        assert client.stdout is not None
        assert await asyncio.wait_for(client.stdout.readline(), DEADLINE) == b"ready\n"


async def tell(started: list[Client]) -> None:
    """Let every client go."""
    for client in started:
        assert client.stdin is not None
        client.stdin.write(b"go\n")
        await client.stdin.drain()


async def ended(started: list[Client]) -> collections.Counter[str]:
    """How the calls of every client ended, once each is told to finish."""
    outputs = await asyncio.gather(
        *(asyncio.wait_for(client.communicate(b"stop\n"), DEADLINE) for client in started)
    )
    summed: collections.Counter[str] = collections.Counter()
    for client, (out, _) in zip(started, outputs, strict=True):
        assert client.returncode == 0
        summed.update(json.loads(out))
    return summed
