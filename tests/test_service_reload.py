"""The rules file of a served process changing under traffic (issue 21, item 12): a file
caught mid-rewrite never drops a domain; an operator still can, by SIGHUP or a restart."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from ratelimit.errors import ConfigurationError
from ratelimit.service import rules_file
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from ratelimit.service.rules_snapshot import Snapshot, starting_rules
from tests.service_process import ServiceProcess

pytestmark = pytest.mark.timeout(120)
RLS = rls_pb2.RateLimitResponse


def rules(alpha: str = "1000/m", beta: str = "1000/m", gamma: str | None = "1000/m") -> str:
    text = f'[[limit]]\ndomain = "alpha"\ndescriptor = ["user"]\nrule = "{alpha}"\n\n'
    text += f'[[limit]]\ndomain = "beta"\ndescriptor = ["user"]\nrule = "{beta}"\n'
    if gamma is not None:
        text += f'\n[[limit]]\ndomain = "gamma"\ndescriptor = ["user"]\nrule = "{gamma}"\n'
    return text


async def ask(stub: rls_pb2_grpc.RateLimitServiceAsyncStub, domain: str, user: str) -> str:
    """``OK``, ``OVER_LIMIT``, or the status code that refused the call."""
    request = rls_pb2.RateLimitRequest(domain=domain)
    request.descriptors.add().entries.add(key="user", value=user)
    try:
        answer = await stub.ShouldRateLimit(request, timeout=10)
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)
    return str(RLS.Code.Name(answer.overall_code))


async def limit_of(address: str, domain: str) -> tuple[str, int]:
    """What one call of ``domain`` says: its code and its rule's count."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = rls_pb2.RateLimitRequest(domain=domain)
        request.descriptors.add().entries.add(key="user", value=f"probe-{time.monotonic_ns()}")
        try:
            answer = await stub.ShouldRateLimit(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name), 0
        return "OK", answer.statuses[0].current_limit.requests_per_unit


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)  # polling another process's state, not waiting for a window


def rewrite_in_place(path: Path, versions: list[str], pause: float) -> None:
    """What an editor or a config tool does without a rename: truncate the file, then write
    it in two parts, pausing after each step (longer than the service's look at the file,
    so that it sees the empty and the half-written file)."""
    for text in versions:
        half = text.index('[[limit]]\ndomain = "beta"')
        with path.open("r+", encoding="utf-8") as file:
            file.truncate(0)
            file.flush()
            time.sleep(pause)
            file.write(text[:half])  # valid TOML: alpha only
            file.flush()
            time.sleep(pause)
            file.write(text[half:])
            file.flush()
        time.sleep(pause)


@pytest.mark.long
def test_a_file_rewritten_in_place_never_drops_a_domain(tmp_path: Path) -> None:
    """A writer truncates and rewrites the file 3 times while clients keep asking both
    domains: no answer is NOT_FOUND, and the last version is applied."""
    path = tmp_path / "rules.toml"
    path.write_text(rules())
    versions = [rules(alpha=f"{count}/m") for count in (901, 902, 903)]

    async def traffic(address: str, done: threading.Event) -> dict[str, int]:
        answers: dict[str, int] = {}
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            sent = 0
            while not done.is_set():
                for domain in ("alpha", "beta"):
                    sent += 1
                    code = await ask(stub, domain, f"u{sent}")
                    answers[code] = answers.get(code, 0) + 1
        return answers

    def write(done: threading.Event) -> None:
        try:
            rewrite_in_place(path, versions, 1.3)
        finally:
            done.set()

    with ServiceProcess({"RATELIMIT_RULES_FILE": str(path)}) as service:
        done = threading.Event()
        writer = threading.Thread(target=write, args=(done,))
        writer.start()
        try:
            answers = asyncio.run(traffic(service.address, done))
        finally:
            writer.join()
        _until(lambda: asyncio.run(limit_of(service.address, "alpha")) == ("OK", 903))
        output = service.output
    assert answers.get("NOT_FOUND", 0) == 0, answers
    assert set(answers) == {"OK"}, answers
    assert sum(answers.values()) > 50
    assert "has no limit left for domain 'beta'" in output  # the half-written file, kept out


@pytest.mark.long
def test_removing_a_domain_takes_sighup_or_a_restart(tmp_path: Path) -> None:
    """A file that really drops ``gamma`` (replaced whole, by a rename): the watcher keeps
    the old rules and says why; SIGHUP applies it; so does a restart."""
    path = tmp_path / "rules.toml"
    path.write_text(rules())
    with ServiceProcess({"RATELIMIT_RULES_FILE": str(path)}) as service:
        address = service.address
        assert asyncio.run(limit_of(address, "gamma")) == ("OK", 1000)
        written = tmp_path / "rules.toml.new"
        written.write_text(rules(alpha="7/m", gamma=None))
        os.replace(written, path)
        _until(lambda: "has no limit left for domain 'gamma'" in service.output)
        assert asyncio.run(limit_of(address, "gamma")) == ("OK", 1000)  # kept
        assert asyncio.run(limit_of(address, "alpha")) == ("OK", 1000)  # all the old rules
        service.signal(signal.SIGHUP)
        _until(lambda: "domain 'gamma' removed" in service.output)
        assert asyncio.run(limit_of(address, "gamma")) == ("NOT_FOUND", 0)
        assert asyncio.run(limit_of(address, "alpha")) == ("OK", 7)
    with ServiceProcess({"RATELIMIT_RULES_FILE": str(path)}) as restarted:
        assert asyncio.run(limit_of(restarted.address, "gamma")) == ("NOT_FOUND", 0)
        assert asyncio.run(limit_of(restarted.address, "beta")) == ("OK", 1000)


def test_a_rules_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_bytes(b'[[limit]]\ndomain = "\xff"\n')
    with pytest.raises(ConfigurationError, match=r"rules file .*rules.toml: not UTF-8 text"):
        rules_file.load(path)


EDGE = """\
[[limit]]
domain = "edge"
descriptor = ["remote_address"]
rule = "100/m"

[[limit]]
domain = "edge"
descriptor = ["path=/login", "remote_address"]
rule = "2/m"
"""


async def test_a_file_that_lost_one_limit_of_a_domain_is_kept_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer that paused after its first table (longer than the settle time) leaves a
    valid file with the domain but without its second limit, whose descriptors would then
    be answered OK: that file is not applied; SIGHUP applies it."""
    path = tmp_path / "rules.toml"
    path.write_text(EDGE)
    watcher = rules_file.RulesWatcher(rules_file.load(path))
    path.write_text(EDGE[: EDGE.index("\n\n[[limit]]") + 1])  # the first table only
    assert watcher.changed()
    assert await watcher.reload()  # looked at, and kept out
    assert len(watcher.rules.limits) == 2
    assert "lacks domain 'edge' [path=/login, remote_address] (line 6)" in caplog.text
    path.write_text(EDGE.replace('rule = "2/m"', 'rule = "3/m"'))  # the writer goes on
    assert await watcher.reload()
    assert [str(limit.rules) for limit in watcher.rules.limits] == ["100/m", "3/m"]
    path.write_text(EDGE[: EDGE.index("\n\n[[limit]]") + 1])
    assert await watcher.reload(explicit=True)  # SIGHUP: as written
    assert len(watcher.rules.limits) == 1
    assert "1 limits removed" in caplog.text


def test_a_worker_starts_with_the_rules_its_siblings_hold(tmp_path: Path) -> None:
    """``--workers``: each worker writes the rules file it applied to the supervisor's
    snapshot; one that starts takes the snapshot's rules when the file differs, and looks
    at the file at once (applying it only if it removes nothing), as the others did."""
    path, snapshot = tmp_path / "rules.toml", Snapshot(str(tmp_path / "held.toml"))
    path.write_text(EDGE)
    first, look = starting_rules(str(path), "sliding-log", snapshot)
    assert first is not None
    assert not look
    assert snapshot.read() == EDGE.encode()  # the first worker's file, for the others
    lost = EDGE[: EDGE.index("\n\n[[limit]]") + 1]  # a limit gone, without SIGHUP
    path.write_text(lost)
    again, look = starting_rules(str(path), "sliding-log", snapshot)
    assert again is not None
    assert look
    assert len(again.limits) == 2  # the limits the others hold
    assert again.content == EDGE.encode()
    watcher = rules_file.RulesWatcher(again)
    watcher.look_again()
    assert watcher.changed()
    snapshot.write(lost.encode())  # what SIGHUP's reload makes the workers write
    applied, look = starting_rules(str(path), "sliding-log", snapshot)
    assert applied is not None
    assert not look
    assert len(applied.limits) == 1
    assert starting_rules(None, "sliding-log", snapshot) == (None, False)


def test_a_snapshot_that_does_not_parse_leaves_the_file(tmp_path: Path) -> None:
    path, snapshot = tmp_path / "rules.toml", Snapshot(str(tmp_path / "held.toml"))
    path.write_text(EDGE)
    snapshot.write(b"[[limit]]\ndomain = 'edge'\n")
    rules, look = starting_rules(str(path), "sliding-log", snapshot)
    assert rules is not None
    assert (len(rules.limits), look) == (2, False)
    assert snapshot.read() == EDGE.encode()
    path.unlink()  # the file gone: the snapshot's rules, the file looked at (and kept out)
    rules, look = starting_rules(str(path), "sliding-log", snapshot)
    assert rules is not None
    assert (len(rules.limits), look) == (2, True)
