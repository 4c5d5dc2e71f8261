"""``ratelimit serve --envoy`` in this process (:class:`~ratelimit.service.envoy_service.
server.EnvoyService`), configured by envoyproxy/ratelimit's variables, counting in memory
(``BACKEND_TYPE=memory``): its gRPC API and health, ``/json``, ``/healthcheck``,
``/rlconfig``, and its configuration directory reloaded when it changes (a failed reload
keeps the configuration in use and counts ``config_load_error``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ratelimit.service.envoy_service import server as envoy_server
from ratelimit.service.envoy_service.server import EnvoyService
from ratelimit.service.envoy_service.settings import EnvoySettings
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.service_process import EnvoyProcess

pytestmark = pytest.mark.timeout(60)
RLS = rls_pb2.RateLimitResponse

FIRST = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
"""
SECOND = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5}
"""


def environment(root: Path, **more: str) -> dict[str, str]:
    env = {
        "RUNTIME_ROOT": str(root),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "BACKEND_TYPE": "memory",
        "USE_STATSD": "false",
        "GRPC_HOST": "127.0.0.1",
        "GRPC_PORT": "0",
        "HOST": "127.0.0.1",
        "PORT": "0",
        "DEBUG_HOST": "127.0.0.1",
        "DEBUG_PORT": "0",
    }
    return env | more


def config_dir(root: Path) -> Path:
    folder = root / "ratelimit" / "config"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Any]]:
    monkeypatch.setattr(envoy_server, "WATCH_EVERY", 0.05)
    services: list[EnvoyService] = []

    async def start(**env: str) -> EnvoyService:
        service = EnvoyService(EnvoySettings.from_env(environment(tmp_path, **env)))
        await service.start()
        services.append(service)
        return service

    yield start
    for service in services:
        service.stop()
        await service.shutdown()


def asked(address: str = "10.0.0.1", domain: str = "edge") -> rls_pb2.RateLimitRequest:
    request = rls_pb2.RateLimitRequest(domain=domain)
    entry = request.descriptors.add().entries.add()
    entry.key, entry.value = "remote_address", address
    return request


async def until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    """Wait for ``condition`` (a reload seen by the watcher), at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.02)  # polling the watcher, not waiting for a window


def file_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with a new modification time even on a coarse clock."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


async def test_grpc_answers_and_health(tmp_path: Path, started: Callable[..., Any]) -> None:
    (config_dir(tmp_path) / "edge.yaml").write_text(FIRST)
    service = await started()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        codes = [(await stub.ShouldRateLimit(asked())).overall_code for _ in range(3)]
        assert codes == [RLS.OK, RLS.OK, RLS.OVER_LIMIT]
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.ShouldRateLimit(rls_pb2.RateLimitRequest(descriptors=asked().descriptors))
        assert raised.value.code() == grpc.StatusCode.UNKNOWN
        assert raised.value.details() == "rate limit domain must not be empty"
        checked = health_pb2_grpc.HealthStub(channel)
        said = await checked.Check(health_pb2.HealthCheckRequest(service="ratelimit"))
        assert said.status == health_pb2.HealthCheckResponse.SERVING
    assert service.stats.service_error.value == 1
    key = "ratelimit.service.rate_limit.edge.remote_address"
    assert service.stats.counters[f"{key}.total_hits"].value == 3
    # its interceptor's stats: every call counted and timed, the refused one too
    calls = service.stats.counters["ratelimit_server.ShouldRateLimit.total_requests"]
    assert calls.value == 4
    assert service.stats.timers["ratelimit_server.ShouldRateLimit.response_time"].count == 4
    assert service.stats.counters["ratelimit_server.Check.total_requests"].value == 1


async def test_json_healthcheck_and_rlconfig(tmp_path: Path, started: Callable[..., Any]) -> None:
    (config_dir(tmp_path) / "edge.yaml").write_text(FIRST)
    service = await started()
    body = {
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "remote_address", "value": "a"}]}],
    }
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as client:
        first = await client.post("/json", content=json.dumps(body))
        assert first.status_code == 200
        assert first.json()["overallCode"] == "OK"
        limit = first.json()["statuses"][0]["currentLimit"]
        assert limit == {"requestsPerUnit": 2, "unit": "HOUR"}
        await client.post("/json", content=json.dumps(body))
        third = await client.post("/json", content=json.dumps(body))
        assert third.status_code == 429
        assert third.json()["overallCode"] == "OVER_LIMIT"
        assert (await client.post("/json", content=b"{not json")).status_code == 400
        unknown = await client.post("/json", content=json.dumps({"domain": "edge", "oops": 1}))
        assert unknown.status_code == 400
        empty = await client.post("/json", content=json.dumps({"domain": "edge"}))
        assert empty.status_code == 400
        health = await client.get("/healthcheck")
        assert (health.status_code, health.text) == (200, "OK")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.debug_port}") as client:
        dumped = (await client.get("/rlconfig")).text
        assert dumped == (
            "edge.remote_address: unit=HOUR requests_per_unit=2, shadow_mode: false, "
            "quota_mode: false\n"
        )
        assert "config_load_success: 1" in (await client.get("/stats")).text


async def test_a_changed_directory_is_reloaded_and_a_bad_one_kept_out(
    tmp_path: Path, started: Callable[..., Any]
) -> None:
    path = config_dir(tmp_path) / "edge.yaml"
    path.write_text(FIRST)
    service = await started()
    answers = service.answers
    assert service.config is not None
    file_changed(path, SECOND)
    await until(lambda: service.stats.config_load_success.value == 2)
    for _ in range(5):
        assert (await answers.should_rate_limit(asked("b"))).overall_code == RLS.OK
    assert (await answers.should_rate_limit(asked("b"))).overall_code == RLS.OVER_LIMIT
    # a bad file: the configuration in use stays, the error is counted
    kept = service.config
    file_changed(path, SECOND + "  - key: remote_address\n")  # a duplicate composite key
    await until(lambda: service.stats.config_load_error.value == 1)
    assert service.config is kept
    assert (await answers.should_rate_limit(asked("c"))).statuses[0].limit_remaining == 4
    # a new file beside it
    file_changed(path, SECOND)
    (path.parent / "other.yaml").write_text(FIRST.replace("edge", "other"))
    await until(lambda: service.stats.config_load_success.value == 3)
    assert service.config is not None
    assert set(service.config.domains) == {"edge", "other"}


async def test_a_kubernetes_configmap_needs_ignoredotfiles(
    tmp_path: Path, started: Callable[..., Any]
) -> None:
    """A ConfigMap mounts each file as a link into ``..data``, a link to a dot directory
    holding the files: read whole, every domain is there twice (as its service finds)."""
    folder = config_dir(tmp_path)
    (folder / "..2026_12_06").mkdir()
    (folder / "..2026_12_06" / "edge.yaml").write_text(FIRST)
    (folder / "..data").symlink_to("..2026_12_06")
    (folder / "edge.yaml").symlink_to("..data/edge.yaml")
    service = await started()
    assert service.config is None
    assert service.stats.config_load_error.value == 1
    ignoring = await started(RUNTIME_IGNOREDOTFILES="true")
    assert ignoring.config is not None
    assert set(ignoring.config.domains) == {"edge"}


async def test_healthy_only_with_a_configuration_when_asked(
    tmp_path: Path, started: Callable[..., Any]
) -> None:
    config_dir(tmp_path)  # empty
    service = await started(HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED="true")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        checked = health_pb2_grpc.HealthStub(channel)
        named = await checked.Check(health_pb2.HealthCheckRequest(service="ratelimit"))
        whole = await checked.Check(health_pb2.HealthCheckRequest(service=""))
    assert named.status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert whole.status == health_pb2.HealthCheckResponse.SERVING  # as grpc-go leaves it
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as client:
        assert (await client.get("/healthcheck")).status_code == 500
        (config_dir(tmp_path) / "edge.yaml").write_text(FIRST)
        await until(lambda: service.stats.config_load_success.value == 2)
        await until(lambda: service.is_healthy())
        assert (await client.get("/healthcheck")).status_code == 200


async def test_our_algorithm_beneath(tmp_path: Path, started: Callable[..., Any]) -> None:
    """``RATELIMIT_ALGORITHM``: the directory's limits (a ``rule`` of ours too) decided by
    our sliding log; a refused request counts nothing."""
    (config_dir(tmp_path) / "edge.yaml").write_text(
        'domain: edge\ndescriptors:\n  - key: remote_address\n    rule: "2/10s"\n'
    )
    service = await started(RATELIMIT_ALGORITHM="sliding-log")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        answers = [await stub.ShouldRateLimit(asked()) for _ in range(4)]
    assert [a.overall_code for a in answers] == [RLS.OK, RLS.OK, RLS.OVER_LIMIT, RLS.OVER_LIMIT]
    wait = answers[-1].statuses[0].duration_until_reset.ToMicroseconds()
    assert 0 < wait <= 10_000_000
    key = "ratelimit.service.rate_limit.edge.remote_address"
    assert service.stats.counters[f"{key}.over_limit"].value == 2


async def test_the_watch_outlives_a_failure(
    tmp_path: Path, started: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn of the watch that fails is logged; the next ones still reload."""
    path = config_dir(tmp_path) / "edge.yaml"
    path.write_text(FIRST)
    service = await started()
    failing = {"left": 3}
    real = envoy_server.signature

    def flaky(settings: EnvoySettings) -> tuple[Any, ...]:
        if failing["left"]:
            failing["left"] -= 1
            raise RuntimeError("a directory that cannot be walked for a moment")
        return real(settings)

    monkeypatch.setattr(envoy_server, "signature", flaky)
    await until(lambda: failing["left"] == 0)
    file_changed(path, SECOND)
    await until(lambda: service.stats.config_load_success.value == 2)


async def test_prometheus_and_a_unix_socket(tmp_path: Path, started: Callable[..., Any]) -> None:
    """``USE_PROMETHEUS`` (with ``USE_STATSD=false``, as its service requires) serves its
    stat names on ``PROMETHEUS_ADDR``; ``GRPC_UDS`` serves gRPC on a Unix socket."""
    (config_dir(tmp_path) / "edge.yaml").write_text(FIRST)
    socket_path = tmp_path / "rl.sock"
    service = await started(
        USE_PROMETHEUS="true", PROMETHEUS_ADDR="127.0.0.1:0", GRPC_UDS=str(socket_path)
    )
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(3):
            await stub.ShouldRateLimit(asked())
    assert service.metrics_port
    async with httpx.AsyncClient() as client:
        scraped = (await client.get(f"http://127.0.0.1:{service.metrics_port}/metrics")).text
    lines = scraped.splitlines()
    hits = 'ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address"} 3'
    assert hits in lines
    over = 'ratelimit_service_rate_limit_over_limit{domain="edge",key1="remote_address"} 1'
    assert over in lines
    assert 'ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 3' in lines


async def test_statsd_gets_its_stat_names(tmp_path: Path, started: Callable[..., Any]) -> None:
    """``USE_STATSD`` (the default), over TCP as gostats sends them."""
    (config_dir(tmp_path) / "edge.yaml").write_text(FIRST)
    received: list[bytes] = []

    async def take(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            received.append(line)
        writer.close()

    listener = await asyncio.start_server(take, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        service = await started(
            USE_STATSD="true",
            STATSD_HOST="127.0.0.1",
            STATSD_PORT=str(port),
            STATS_FLUSH_INTERVAL="50ms",
        )
        await service.answers.should_rate_limit(asked())
        line = b"ratelimit.service.rate_limit.edge.remote_address.total_hits:1|c\n"
        await until(lambda: line in received)
    finally:
        listener.close()


def test_the_command_names_what_it_does_not_honour(tmp_path: Path) -> None:
    """One warning at start names the variables set that are not honoured; a flag of the
    rules-file service with ``--envoy`` stops it."""
    (config_dir(tmp_path) / "edge.yaml").write_text(FIRST)
    env = environment(tmp_path, GRPC_MAX_CONNECTION_AGE="1h", TRACING_ENABLED="true")
    with EnvoyProcess(env) as process:
        assert process.port
    warned = [line for line in process.lines if "not honoured" in line]
    assert len(warned) == 1
    assert warned[0].endswith('GRPC_MAX_CONNECTION_AGE, TRACING_ENABLED"')
    refused = subprocess.run(
        [sys.executable, "-m", "ratelimit", "serve", "--envoy", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert refused.returncode != 0
    assert "--port with --envoy" in refused.stderr


def test_json_logs(tmp_path: Path) -> None:
    """``LOG_FORMAT=json``: one JSON object a line, at ``LOG_LEVEL``."""
    (config_dir(tmp_path) / "edge.yaml").write_text(FIRST)
    env = environment(tmp_path, LOG_FORMAT="json", LOG_LEVEL="info")
    with EnvoyProcess(env) as process:
        assert process.port
    logged = [json.loads(line) for line in process.lines if line.startswith("{")]
    assert any(entry["@message"] == "Successfully loaded new configuration" for entry in logged)
    assert all(entry["level"] in ("info", "warning", "error") for entry in logged)
