"""``ratelimit serve``: the gRPC service (``grpc.aio``).

ratio's ``RateLimitService/RateLimit`` and Envoy's
``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``, gRPC health checking
(``grpc.health.v1``: ``""``, each API's service name, and :data:`STORE_SERVICE` for the
storage) and server reflection. SIGTERM (or SIGINT) stops it gracefully within
:data:`GRACE_SECONDS` (see :meth:`Service.shutdown`): every call the service takes is
answered, or refused ``UNAVAILABLE`` without being decided. SIGHUP, or a change to the rules
file seen within a second, reloads the rules file; a bad new file keeps the old rules and
logs why. With ``RATELIMIT_TLS_CERT`` and ``RATELIMIT_TLS_KEY``, every API (health and
reflection included) is served over TLS only; with ``RATELIMIT_TLS_CLIENT_CA`` too, only to
clients with a certificate that CA signed (:mod:`ratelimit.service.tls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ratelimit.core.extras import needs_extra
from ratelimit.errors import BackendError, ConfigurationError, LockTimeoutError
from ratelimit.front.limiter import RateLimit
from ratelimit.service import rules_file
from ratelimit.service.config import ServiceConfig
from ratelimit.service.config import address as host_port
from ratelimit.service.observing import WORKER, observing, start_line
from ratelimit.service.rules_snapshot import SNAPSHOT, Snapshot, starting_rules
from ratelimit.service.tls import server_credentials
from ratelimit.service.upgrading import warn_of_old_namespace

if TYPE_CHECKING:
    from ratelimit.service.prometheus import ServiceMetrics

with needs_extra("server"):
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from ratelimit.service.handlers import (
        RATIO_KEY,
        Handlers,
        InvalidRequest,
        UnknownDomain,
        ratio_tree,
    )
    from ratelimit.service.penalties import PenalizingHandlers
    from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
    from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc

logger = logging.getLogger("ratelimit.service")

T = TypeVar("T")
GRACE_SECONDS = 10.0
"""From SIGTERM to the server stopped, at most."""
WATCH_EVERY = 1.0
"""How often the rules file is looked at."""
DRAIN_QUIET = 0.25
"""How long no call must come for a phase of the shutdown to end early."""
DRAIN_MOST = 5.0
"""How long, at most, calls are still decided after health turned ``NOT_SERVING``."""
HOLD_MOST = 1.0
"""How long, at most, new calls are held (not decided) before the server stops."""
STOPPING = "the service is stopping: ask another replica (nothing was counted)"
RATIO_SERVICE = "RateLimitService"
ENVOY_SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
STORE_SERVICE = "ratelimit.store"
"""The health name of the storage: ``NOT_SERVING`` while it fails (the service still answers,
by its failure policy), ``SERVING`` when it answers."""
STORE_EVERY = 0.5
"""How often the storage's state is looked at, and asked again while it fails."""


class Traffic:
    """Calls being decided, when the last call came, and whether new calls are still
    decided (``holding``: they wait for ``released``, then are refused ``UNAVAILABLE``);
    ``metrics``: where calls in flight and each call's time are told."""

    def __init__(self, metrics: ServiceMetrics | None = None) -> None:
        self.active = 0
        self.last = 0.0
        self.holding = False
        self.released = asyncio.Event()
        self.metrics = metrics

    def __enter__(self) -> None:
        self.active += 1
        if self.metrics is not None:
            self.metrics.in_flight.inc()

    def __exit__(self, *exc: object) -> None:
        self.active -= 1
        if self.metrics is not None:
            self.metrics.in_flight.dec()

    async def drained(self, quiet: float, most: float) -> None:
        """Return once no call is in flight and none came for ``quiet`` seconds (calls a
        client sent before it saw NOT_SERVING are still arriving), or after ``most``."""
        deadline = time.monotonic() + most
        while time.monotonic() < deadline:
            if self.active == 0 and time.monotonic() - self.last >= quiet:
                return
            await asyncio.sleep(quiet / 4)


async def _answered(
    traffic: Traffic, context: grpc.aio.ServicerContext[Any, Any], work: Awaitable[T], key: str
) -> T:
    """One call's answer, counted in ``traffic`` (under ``key``, with the status it ended
    with); a request the handlers refuse is aborted with its status code (``abort`` raises).
    While the service stops, a new call is held undecided and then refused ``UNAVAILABLE``."""
    traffic.last = started = time.monotonic()
    code = "UNKNOWN"
    try:
        if traffic.holding:
            if isinstance(work, Coroutine):
                work.close()  # never started: nothing decided, nothing counted
            await traffic.released.wait()
            code = "UNAVAILABLE"
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
        with traffic:
            try:
                answer = await work
                code = "OK"
                return answer
            except InvalidRequest as exc:
                code = "INVALID_ARGUMENT"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except UnknownDomain as exc:
                code = "NOT_FOUND"
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            except asyncio.CancelledError:  # the caller gave up (its deadline passed)
                code = "CANCELLED"
                raise
    finally:
        if traffic.metrics is not None:
            traffic.metrics.called(key, code, time.monotonic() - started)
    raise AssertionError("unreachable: abort raises")


class _Ratio(ratio_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, handlers: Handlers, traffic: Traffic) -> None:
        self.handlers = handlers
        self.traffic = traffic

    async def RateLimit(  # the RPC's name
        self, request: ratio_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ratio_pb2.RateLimitResponse:
        work = self.handlers.rate_limit(request)
        return await _answered(self.traffic, context, work, RATIO_KEY)


class _Envoy(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, handlers: Handlers, traffic: Traffic) -> None:
        self.handlers = handlers
        self.traffic = traffic

    async def ShouldRateLimit(  # the RPC's name
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> rls_pb2.RateLimitResponse:
        work = self.handlers.should_rate_limit(request)
        key = self.handlers.envoy_key(request.domain)
        return await _answered(self.traffic, context, work, key)


class Service:
    """One running service: its limiter, handlers, gRPC server and rules file watcher."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        held = os.environ.get(SNAPSHOT)
        self._snapshot = Snapshot(held) if held and os.environ.get(WORKER) else None
        self.rules, look = starting_rules(config.rules_file, config.algorithm, self._snapshot)
        self.observing = observing(config.metrics)
        hooks = self.observing.limiter_hooks
        self.metrics = self.observing.prometheus
        if self.metrics is not None and self.rules is not None:
            self.metrics.rules(len(self.rules.limits))
        if config.storage.startswith("memory://"):  # takes no client timeout
            self.limiter = RateLimit.from_url(
                config.storage,
                namespace=config.namespace,
                on_error=config.on_error,
                local_share=config.local_share,
                algorithm=config.algorithm,
                lease=config.lease,
                hooks=hooks,
            )
        else:
            self.limiter = RateLimit.from_url(
                config.storage,
                namespace=config.namespace,
                on_error=config.on_error,
                local_share=config.local_share,
                algorithm=config.algorithm,
                lease=config.lease,
                timeout=config.timeout,
                lock_ttl=max(10.0, 2 * config.timeout),  # outlives the work it guards
                hooks=hooks,
                spread=config.store_spread(),
            )
        self.handlers = PenalizingHandlers(
            self.limiter,
            ratio_tree(config.rules, config.algorithm),
            self.rules,
            config.timeout,
            config.max_descriptors,
            self.metrics,
            config.response_headers,
        )
        # SO_REUSEPORT only for the workers of one supervisor (which checked the port was
        # free); else a second service on a port in use is an error, not a silent half of
        # the traffic
        reuse = 1 if os.environ.get(WORKER) else 0
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", reuse)])
        self.metrics_port: int | None = None
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.traffic = Traffic(self.metrics)
        self._stop = asyncio.Event()
        self._watcher = (
            rules_file.RulesWatcher(
                self.rules,
                config.algorithm,
                None if self.metrics is None else self.metrics.reloaded,
            )
            if self.rules
            else None
        )
        if look and self._watcher is not None:
            self._watcher.look_again()  # started with the rules the other workers hold
        self._asked = False
        self._wake = asyncio.Event()
        self._supervisor = os.getppid() if os.environ.get(WORKER) else None

    async def start(self) -> int:
        traffic = self.traffic
        ratio_pb2_grpc.add_RateLimitServiceServicer_to_server(
            _Ratio(self.handlers, traffic), self.server
        )
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(
            _Envoy(self.handlers, traffic), self.server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (
            RATIO_SERVICE,
            ENVOY_SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.server)
        config = self.config
        address = host_port(config.host, config.port)
        credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
        try:
            if credentials is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, credentials)
        except RuntimeError as exc:  # grpc: "Failed to bind to address ..."
            raise ConfigurationError(f"cannot listen on {address}: {exc}") from None
        if self.port == 0:
            raise ConfigurationError(f"cannot listen on {address}")
        self.metrics_port = self.observing.serve(self.config)
        await self.server.start()
        for name in ("", RATIO_SERVICE, ENVOY_SERVICE, STORE_SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def _watch_store(self) -> None:
        """Keep ``ratelimit.store``'s health in step with the storage: ``NOT_SERVING`` from
        a decision that failed until the storage answers again, which is asked every
        :data:`STORE_EVERY` meanwhile (so that it recovers without traffic)."""
        serving = True
        while True:
            await asyncio.sleep(STORE_EVERY)
            if self.limiter.storage_failing:
                await self._ask_store()
            if serving == self.limiter.storage_failing:
                serving = not serving
                status = health_pb2.HealthCheckResponse
                await self.health.set(
                    STORE_SERVICE, status.SERVING if serving else status.NOT_SERVING
                )

    async def _ask_store(self) -> None:
        """One question to the storage that counts nothing, within the call deadline; an
        answer ends the outage (the failure policy logs it, once)."""
        with contextlib.suppress(BackendError, LockTimeoutError):
            await self.limiter.ping(within=self.config.timeout)

    def reload(self) -> None:
        """SIGHUP: read the rules file again and apply it as written, once it stayed the
        same for a moment (:class:`~ratelimit.service.rules_file.RulesWatcher`)."""
        self._asked = True
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()

    def handle_signals(self) -> None:
        """SIGTERM and SIGINT call :meth:`stop`, SIGHUP :meth:`reload` (from now on: before
        this, SIGHUP's default ends the process). :func:`serve` calls it before it says where
        it listens, which a supervisor of workers waits for before it forwards SIGHUP."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self.reload)

    async def run(self) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT), then shut down gracefully."""
        self.handle_signals()
        watchers = [asyncio.create_task(self._watch()), asyncio.create_task(self._watch_store())]
        if self._supervisor is not None:
            watchers.append(asyncio.create_task(self._watch_supervisor(self._supervisor)))
        try:
            await self._stop.wait()
        finally:
            for watcher in watchers:
                watcher.cancel()
            await self.shutdown()

    async def shutdown(self) -> None:
        """Stop within :data:`GRACE_SECONDS`, answering every call taken:

        1. health turns ``NOT_SERVING`` on every name, and calls are still decided until
           none has come for :data:`DRAIN_QUIET` (those clients sent before they saw it;
           a client that watches health sends no more), at most :data:`DRAIN_MOST`;
        2. new calls are held, undecided, until none has come for :data:`DRAIN_QUIET` (a
           client that waits for its answers sends no more), at most :data:`HOLD_MOST`;
        3. the server stops taking streams (HTTP/2 GOAWAY: a client's next call goes
           elsewhere, or fails ``UNAVAILABLE`` without reaching it), the held calls are
           refused ``UNAVAILABLE``, and the storage is closed (what this process's leases
           hold unused given back first: ``RATELIMIT_LEASE``).

        gRPC cancels a call that reached the server but no handler when the server stops:
        holding new calls in step 2 keeps that queue empty.
        """
        stopped_by = time.monotonic() + GRACE_SECONDS
        traffic = self.traffic
        await self.health.enter_graceful_shutdown()
        await traffic.drained(DRAIN_QUIET, DRAIN_MOST)
        traffic.holding = True
        await traffic.drained(DRAIN_QUIET, HOLD_MOST)
        stopping = asyncio.create_task(
            self.server.stop(max(stopped_by - time.monotonic(), DRAIN_QUIET))
        )
        await asyncio.sleep(0)  # the server has stopped taking streams: GOAWAY is queued
        traffic.released.set()
        await stopping
        await self.limiter.aclose()
        self.observing.close()

    async def _watch_supervisor(self, supervisor: int) -> None:
        """A worker of ``--workers N`` stops when its supervisor is gone (one killed by
        SIGKILL stops no worker), rather than serve the port on its own, unsupervised."""
        while True:  # looked at: no event tells of a parent gone
            await asyncio.sleep(WATCH_EVERY)
            if os.getppid() != supervisor:
                break
        logger.warning("ratelimit: the supervisor (pid %d) is gone: stopping", supervisor)
        nowhere = os.open(os.devnull, os.O_WRONLY)  # standard output was the supervisor's pipe
        os.dup2(nowhere, sys.stdout.fileno())
        os.close(nowhere)
        self.stop()

    async def _watch(self) -> None:
        """Look at the rules file every second, and at once on SIGHUP."""
        while self._watcher is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), WATCH_EVERY)
            self._wake.clear()
            asked, self._asked = self._asked, False
            if asked or self._watcher.changed():
                if not await self._watcher.reload(explicit=asked):
                    self._asked = self._asked or asked  # still being written: look again
                if self._watcher.rules is not self.rules and self._snapshot is not None:
                    self._snapshot.write(self._watcher.rules.content)  # for a worker restarted
                self.rules = self.handlers.rules = self._watcher.rules


async def serve(config: ServiceConfig) -> None:
    """Start the service, print where it listens, and serve until stopped."""
    service = Service(config)
    port = await service.start()
    service.handle_signals()
    print(start_line(config, port, service.metrics_port), flush=True)
    await warn_of_old_namespace(service.limiter, config)  # once, serving already
    await service.run()
    print("ratelimit: stopped", flush=True)
