"""The service's Prometheus endpoint, scraped from a real ``ratelimit serve``: decisions per
descriptor and limit, latency, reloads, the store's health through an outage, and the
Grafana dashboard in ``deploy/`` asking only for metrics (and labels) the service exports."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ratelimit.core.decision import Decision, RuleState
from ratelimit.core.plan import compile_tree
from ratelimit.rules.tree import to_tree
from ratelimit.service.prometheus import ServiceMetrics
from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from ratelimit.service.rules_file import DescriptorLimit
from tests.redis_server import RedisServer
from tests.service_process import ROOT, ServiceProcess, rules_env

pytestmark = pytest.mark.timeout(120)
RLS = rls_pb2.RateLimitResponse
RULES = """\
[[limit]]
domain = "web"
descriptor = ["remote_address"]
rule = "3/h"

[[limit]]
domain = "web"
descriptor = ["client_id"]
rule = "1/h"
shadow = true
"""
DASHBOARD = ROOT / "deploy" / "grafana" / "ratelimit-service.json"


def metrics_url(service: ServiceProcess) -> str:
    found = re.search(r"metrics on (http://\S+/metrics)", service.output)
    assert found, service.output
    return found.group(1)


def scrape(service: ServiceProcess) -> list[Sample]:
    text = httpx.get(metrics_url(service), timeout=10).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def until(service: ServiceProcess, check: Callable[[list[Sample]], bool]) -> list[Sample]:
    """Scrape until ``check`` holds (the service acts on a signal or the store in its own
    time), within a generous deadline."""
    deadline = time.monotonic() + 30
    while True:
        samples = scrape(service)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)  # polling a child process's state, not waiting out a window


def envoy(address: str, *descriptors: tuple[str, str], domain: str = "web") -> int:
    request = rls_pb2.RateLimitRequest(domain=domain)
    for key, val in descriptors:
        request.descriptors.add().entries.add(key=key, value=val)
    with grpc.insecure_channel(address) as channel:
        answer = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=10)
    return int(answer.overall_code)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    with ServiceProcess({**rules_env(tmp_path, RULES), "RATELIMIT_METRICS": "prometheus"}) as s:
        yield s


def test_each_descriptor_is_counted_by_domain_limit_and_outcome(service: ServiceProcess) -> None:
    for _ in range(5):  # 3/h: allowed, allowed, near (3 of 3), over, over; the shadow 1/h:
        envoy(service.address, ("remote_address", "10.0.0.1"), ("client_id", "client-c1"))
    with grpc.insecure_channel(service.address) as channel:
        ratio_pb2_grpc.RateLimitServiceStub(channel).RateLimit(
            ratio_pb2.RateLimitRequest(owner="o", resource="r"), timeout=10
        )
    samples = scrape(service)
    name = "ratelimit_decisions_total"
    ip = {"key": "envoy/web", "limit": "[remote_address] 3/h"}
    assert value(samples, name, **ip, outcome="allowed") == 2
    assert value(samples, name, **ip, outcome="near_limit") == 1
    assert value(samples, name, **ip, outcome="over_limit") == 2
    client = {"key": "envoy/web", "limit": "[client_id] 1/h"}
    assert value(samples, name, **client, outcome="near_limit") == 1  # its one call: 1 of 1
    assert value(samples, name, **client, outcome="shadow") == 4  # refused, let through
    assert value(samples, name, key="ratio", limit="100/m", outcome="allowed") == 1
    count = "ratelimit_decision_duration_seconds_count"
    assert value(samples, count, key="envoy/web") == 5  # one per call, not per descriptor
    assert value(samples, count, key="ratio") == 1
    assert value(samples, "ratelimit_rules_in_force") == 2
    assert value(samples, "ratelimit_calls_in_flight") == 0
    assert value(samples, "ratelimit_store_up") == 1
    text = httpx.get(metrics_url(service), timeout=10).text
    assert "10.0.0.1" not in text  # values are never labels
    assert "client-c1" not in text


def test_labels_never_carry_what_a_request_sent(service: ServiceProcess) -> None:
    """A request's own limit, its descriptor keys, a domain with a typo: bounded labels."""
    for rate in range(7, 12):  # five rates of a request's own limit, on new keys each time
        request = rls_pb2.RateLimitRequest(domain="web")
        entry = request.descriptors.add()
        entry.entries.add(key=f"made-up-{rate}", value="v")
        entry.limit.requests_per_unit, entry.limit.unit = rate, 2  # per minute
        over = request.descriptors.add()
        over.entries.add(key="remote_address", value="10.9.9.9")
        over.limit.requests_per_unit, over.limit.unit = 1000 + rate, 2
        blocked = request.descriptors.add()
        blocked.entries.add(key=f"blocked-{rate}", value="v")
        blocked.limit.requests_per_unit, blocked.limit.unit = 0, 2
        with grpc.insecure_channel(service.address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            assert stub.ShouldRateLimit(request, timeout=10).overall_code == RLS.OVER_LIMIT
    with pytest.raises(grpc.RpcError) as unknown:
        envoy(service.address, ("remote_address", "a"), domain="typo-domain-4711")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    samples = scrape(service)
    decisions = [s for s in samples if s.name == "ratelimit_decisions_total"]
    limits = {s.labels["limit"] for s in decisions}
    assert limits == {"(request limit)", "[remote_address] (override)"}
    assert value(samples, "ratelimit_decisions_total", limit="(request limit)") == 10
    text = httpx.get(metrics_url(service), timeout=10).text
    # "1007/": a rate as a rule's text; a bare "1007" may be in a sample's value (a time)
    for sent in ("made-up", "blocked-", "1007/", ":1007", "typo-domain"):
        assert sent not in text
    assert value(samples, "ratelimit_calls_total", key="envoy/web", code="OK") == 5
    assert value(samples, "ratelimit_calls_total", key="envoy/(unknown)", code="NOT_FOUND") == 1


def test_a_descriptor_near_any_of_its_rules_counts_as_near_the_limit() -> None:
    """``10/m & 1000/h`` with 1 of 10 per minute and 851 of 1000 per hour used: near, though
    the rule with the least left (the status's) is at 10 %."""
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    tree = to_tree("10/m & 1000/h")
    limit = DescriptorLimit("web", (("k", None),), tree, tree, "d_x", False, 3)
    minute, hour = compile_tree(tree).rules
    states = [[RuleState(minute, 0, False, 9, 60.0), RuleState(hour, 1, False, 149, 3600.0)]]
    status = RLS.DescriptorStatus(code=RLS.OK, limit_remaining=9)
    status.current_limit.requests_per_unit = 10
    decision = Decision(True, 0.0, minute, 9, "envoy/web")
    metrics.descriptors("web", [(0, limit, "v", 1)], decision, [status], [False], states)
    labels = {"key": "envoy/web", "limit": "[k] 10/m & 1000/h"}
    near = registry.get_sample_value(
        "ratelimit_decisions_total", {**labels, "outcome": "near_limit"}
    )
    assert near == 1


def test_a_ratio_call_near_any_of_its_rules_counts_as_near_the_limit() -> None:
    """Ratio's API under ``10/m & 1000/h`` with 1 of 10 per minute and 850 of 1000 per hour
    used: near (80 % of *any* rule), though the rule with the least left is at 10 %."""
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    minute, hour = compile_tree(to_tree("owner_resource:10/m & owner_resource:1000/h")).rules
    states = (RuleState(minute, 0, False, 9, 60.0), RuleState(hour, 1, False, 150, 3600.0))
    decision = Decision(True, 0.0, minute, 9, "ratio", _states=states)
    metrics.ratio(decision, "owner_resource")
    far = Decision(True, 0.0, minute, 9, "ratio", _states=states[:1])
    metrics.ratio(far, "owner_resource")
    labels = {"key": "ratio", "limit": "10/m"}
    count = registry.get_sample_value
    assert count("ratelimit_decisions_total", {**labels, "outcome": "near_limit"}) == 1
    assert count("ratelimit_decisions_total", {**labels, "outcome": "allowed"}) == 1


def test_reloads_are_counted_ok_and_failed(service: ServiceProcess, tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text("[[limit]]\ndomain = 'web'\n")  # no descriptor: refused, old rules stay
    service.signal(signal.SIGHUP)
    failed = {"result": "failed"}
    samples = until(service, lambda s: value(s, "ratelimit_rules_reloads_total", **failed) >= 1)
    assert value(samples, "ratelimit_rules_reloads_total", **failed) >= 1  # the watcher may too
    assert value(samples, "ratelimit_rules_reloads_total", result="ok") == 0
    assert value(samples, "ratelimit_rules_in_force") == 2
    loaded = value(samples, "ratelimit_rules_loaded_timestamp_seconds")
    path.write_text(RULES.split("\n\n")[0] + "\n")  # one limit left
    service.signal(signal.SIGHUP)
    ok = {"result": "ok"}
    samples = until(service, lambda s: value(s, "ratelimit_rules_reloads_total", **ok) >= 1)
    assert value(samples, "ratelimit_rules_reloads_total", **ok) >= 1
    assert value(samples, "ratelimit_rules_in_force") == 1
    assert value(samples, "ratelimit_rules_loaded_timestamp_seconds") >= loaded


def test_an_outage_of_the_store_shows_from_start_to_end(tmp_path: Path) -> None:
    with RedisServer() as redis:
        env = rules_env(tmp_path, RULES, storage=redis.url)
        with ServiceProcess({**env, "RATELIMIT_METRICS": "prometheus"}) as service:
            assert envoy(service.address, ("remote_address", "a")) == RLS.OK
            redis.stop()
            assert envoy(service.address, ("remote_address", "a")) == RLS.OK  # fail-open
            samples = until(service, lambda s: value(s, "ratelimit_store_up") == 0)
            assert value(samples, "ratelimit_store_up") == 0
            assert value(samples, "ratelimit_store_outages_total") == 1
            assert value(samples, "ratelimit_store_failures_total") >= 1
            assert value(samples, "ratelimit_decisions_total", outcome="degraded") == 1
            redis.start()  # the service asks the store while it fails: up without traffic
            samples = until(service, lambda s: value(s, "ratelimit_store_up") == 1)
            assert value(samples, "ratelimit_store_up") == 1
            assert value(samples, "ratelimit_store_outage_seconds_total") > 0


def test_a_metrics_port_in_use_stops_the_service_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = ServiceProcess({"RATELIMIT_METRICS": "prometheus"})
        service.env["RATELIMIT_METRICS_PORT"] = str(port)
        try:
            with pytest.raises(RuntimeError, match="exited with 3") as failed:
                service.start()
        finally:
            service.stop()  # closes its output
        wanted = f"cannot serve metrics on 127.0.0.1:{port} (RATELIMIT_METRICS_HOST, RATELIMIT_"
        assert wanted in str(failed.value)


# --- the dashboard ---

SELECTOR = re.compile(r"\b(ratelimit_[a-z_]+)(?:\{([^}]*)\})?")
BY = re.compile(r"\bby \(([^)]*)\)")
TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus adds to every scraped sample."""


def queries() -> list[tuple[str, str]]:
    """Every (panel title, query) of the dashboard, template variables included."""
    board = json.loads(DASHBOARD.read_text())
    found = [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable {variable['name']}", variable["definition"]))
    return found


def test_the_dashboard_is_well_formed() -> None:
    board = json.loads(DASHBOARD.read_text())
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "key"} <= variables
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:  # one service's panels, not an application's
            assert 'job=~"$job"' in target["expr"], panel["title"]
        assert panel["description"], panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
    for title, expr in queries():
        assert expr.count("(") == expr.count(")"), title


def test_every_dashboard_query_names_metrics_and_labels_the_service_exports(
    service: ServiceProcess,
) -> None:
    envoy(service.address, ("remote_address", "10.0.0.2"))
    samples = scrape(service)
    labels: dict[str, set[str]] = {}
    for sample in samples:
        labels.setdefault(sample.name, set()).update(sample.labels)
    checked = 0
    for title, expr in queries():
        names = SELECTOR.findall(expr)
        assert names, f"{title}: {expr} names no ratelimit metric"
        for name, matchers in names:
            assert name in labels, f"{title}: {name} is not exported"
            wanted = {m.split("=")[0].strip(" !~") for m in matchers.split(",") if m.strip()}
            wanted |= {
                label.strip()
                for group in BY.findall(expr)
                for label in group.split(",")
                if label.strip() and label.strip() != "le"
            }
            wanted -= TARGET_LABELS
            assert wanted <= labels[name], f"{title}: {name} has no label {wanted - labels[name]}"
            checked += 1
    assert checked >= 20
