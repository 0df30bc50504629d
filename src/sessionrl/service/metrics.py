"""Prometheus metrics of one app, in a registry of its own (two apps in one process never mix counts).

`Metrics.middleware` counts requests by route template and status and times them; step outcomes are
counted by the steps router; cache, commit and lane figures are read from the engine at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.results import StepKind

M = TypeVar("M", bound=MetricWrapperBase)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The app's instruments."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "sessionrl_http_requests",
            "HTTP requests answered.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "sessionrl_http_request_seconds",
            "Time to answer an HTTP request.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.steps = Counter(
            "sessionrl_steps", "Steps run, by kind and outcome.", ["kind", "outcome"], registry=self.registry
        )
        self._answered = _Children(self.requests)
        self._timed = _Children(self.latency)
        self._stepped = _Children(self.steps)

    def answered(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one HTTP request to `route` answered with `status`, and time it."""
        self._answered.labels(method, route, str(status)).inc()
        self._timed.labels(route).observe(seconds)

    def count_step(self, kind: str, outcome: str) -> None:
        """Count one step of `kind` that ended with `outcome`."""
        self._stepped.labels(kind, outcome).inc()

    def watch(self, engine: Callable[[], Orchestrator | None]) -> None:
        """Publish the engine's cache size, commit counts and busy lane slots, read when scraped."""

        def read(value: Callable[[Orchestrator], float]) -> Callable[[], float]:
            return lambda: float(value(e)) if (e := engine()) is not None else 0.0

        Gauge(
            "sessionrl_cached_sessions", "Sessions in the engine's LRU.", registry=self.registry
        ).set_function(read(lambda e: len(e.cache)))
        Gauge(
            "sessionrl_commit_batches", "Store transactions committed.", registry=self.registry
        ).set_function(read(lambda e: e.committer.batches))
        Gauge("sessionrl_commit_events", "Events committed.", registry=self.registry).set_function(
            read(lambda e: e.committer.events)
        )
        lanes = Gauge(
            "sessionrl_lane_running", "Steps holding a lane slot.", ["lane"], registry=self.registry
        )
        for kind in StepKind:
            lanes.labels(kind.value).set_function(read(_lane_running(kind)))

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """Wrap `app` so every HTTP request is counted and timed under its route template."""

        async def measured(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            started = time.perf_counter()
            status = 500

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_status)
            finally:
                route = getattr(scope.get("route"), "path", "unmatched")
                self.answered(scope["method"], route, status, time.perf_counter() - started)

        return measured


class _Children(Generic[M]):
    """A labelled metric's children, kept in a dict by label values: the metric's own `labels()` checks
    its arguments and takes a lock on every call, three times a step."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        """The child for these label values (made by the metric the first time)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


def _lane_running(kind: StepKind) -> Callable[[Orchestrator], float]:
    return lambda engine: float(engine.lanes[kind].running)
