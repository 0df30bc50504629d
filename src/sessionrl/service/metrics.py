"""Prometheus metrics of one app, in a registry of its own (two apps in one process never mix counts).

`Metrics.middleware` counts requests by route template and status and times them; step outcomes are
counted by the steps router; cache, commit and lane figures are read from the engine at scrape time.
While `Metrics.gc_pauses()` is open (the service's lifespan), every pause of Python's cyclic garbage
collector is timed by generation: while it runs no thread of the process runs Python, so it is where a
request's time goes when latency has a tail the steps themselves do not explain. A gauge counts the
objects the collector skips until its next full collection (see `sessionrl.service.collector`).
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections import Counter as TallyCounter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import accumulate
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.results import StepKind

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The app's instruments."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tallies = Tallies()
        self.registry.register(self.tallies)
        Gauge(
            "sessionrl_gc_frozen_objects",
            "Objects no garbage collection walks until the next full one (see sessionrl.service.collector).",
            registry=self.registry,
        ).set_function(lambda: float(gc.get_freeze_count()))

    def answered(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one HTTP request to `route` answered with `status`, and time it."""
        tallies = self.tallies
        tallies.requests[method, route, str(status)] += 1
        timed = tallies.latency.get(route)
        if timed is None:
            timed = tallies.latency[route] = new_histogram()
        observe(timed, seconds)

    def count_step(self, kind: str, outcome: str) -> None:
        """Count one step of `kind` that ended with `outcome`."""
        self.tallies.steps[kind, outcome] += 1

    @contextmanager
    def gc_pauses(self) -> Iterator[None]:
        """Time the garbage collector's pauses, by generation, while the block runs.

        The collector is the process's: two apps open at once both count every pause.
        """
        started = [0.0]

        def timed(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                observe(self.tallies.gc[str(info["generation"])], time.perf_counter() - started[0])

        gc.callbacks.append(timed)
        try:
            yield
        finally:
            gc.callbacks.remove(timed)

    def watch(self, engine: Callable[[], Orchestrator | None]) -> None:
        """Publish the engine's cache size and misses, commits and busy lane slots (read when scraped)."""

        def read(value: Callable[[Orchestrator], float]) -> Callable[[], float]:
            return lambda: float(value(e)) if (e := engine()) is not None else 0.0

        Gauge(
            "sessionrl_cached_sessions", "Sessions in the engine's LRU.", registry=self.registry
        ).set_function(read(lambda e: len(e.cache)))
        Gauge(
            "sessionrl_session_cache_misses",
            "Session reads the engine's LRU could not answer (each one read the store).",
            registry=self.registry,
        ).set_function(read(lambda e: e.cache.misses))
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
                self.answered(scope["method"], route_label(scope), status, time.perf_counter() - started)

        return measured


def route_label(scope: Scope) -> str:
    """The template of the route a request matched, to count it under: an API route's path; else the path
    of the plain route or mount that served it (`/openapi.json`, the dashboard), which the framework
    names only by its endpoint; else `unmatched`."""
    route = scope.get("route")
    if route is not None:
        return str(route.path)
    endpoint = scope.get("endpoint")
    if endpoint is not None:
        for candidate in getattr(scope.get("app"), "routes", ()):
            served_by = (getattr(candidate, "endpoint", None), getattr(candidate, "app", None))
            if any(endpoint is server for server in served_by):
                return str(candidate.path)
    return "unmatched"


class Tallies(Collector):
    """Request and step counts kept as plain numbers on the event loop, made into metric families when
    scraped.

    Requests are counted several times a step; a labelled `prometheus_client` metric checks its state and
    takes a lock on every `inc` and `observe`, a cost paid on every step, while a scrape is rare.
    `latency[route]` and `gc[generation]` are histograms as `observe` keeps them.
    """

    def __init__(self) -> None:
        self.requests: TallyCounter[tuple[str, str, str]] = TallyCounter()
        self.latency: dict[str, list[float]] = {}
        self.steps: TallyCounter[tuple[str, str]] = TallyCounter()
        self.gc: dict[str, list[float]] = {str(g): new_histogram() for g in range(len(gc.get_count()))}

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "sessionrl_http_requests", "HTTP requests answered.", labels=["method", "route", "status"]
        )
        for request, count in list(self.requests.items()):  # a copy: a scrape may run beside the loop
            requests.add_metric(request, count)
        latency = histogram_family(
            "sessionrl_http_request_seconds", "Time to answer an HTTP request.", "route", self.latency
        )
        pauses = histogram_family(
            "sessionrl_gc_pause_seconds",
            "Pauses of Python's garbage collector (no thread runs Python meanwhile), by generation.",
            "generation",
            self.gc,
        )
        steps = CounterMetricFamily(
            "sessionrl_steps", "Steps run, by kind and outcome.", labels=["kind", "outcome"]
        )
        for step, count in list(self.steps.items()):
            steps.add_metric(step, count)
        yield from (requests, latency, pauses, steps)


def new_histogram() -> list[float]:
    """An empty histogram over `LATENCY_BUCKETS`: one count per bucket (a value lands in the first bucket
    whose bound is at least the value; the one after the last bound is +Inf), then the sum of the values."""
    return [0.0] * (len(LATENCY_BUCKETS) + 2)


def observe(histogram: list[float], seconds: float) -> None:
    """Count `seconds` in `histogram` (see `new_histogram`)."""
    histogram[bisect_left(LATENCY_BUCKETS, seconds)] += 1
    histogram[-1] += seconds


def histogram_family(name: str, documentation: str, label: str, data: dict[str, list[float]]) -> Metric:
    """Prometheus histograms (cumulative buckets) of `data`'s histograms, one per value of `label`."""
    family = HistogramMetricFamily(name, documentation, labels=[label])
    for value, histogram in list(data.items()):  # a copy: a scrape may run beside the loop
        counts = list(accumulate(histogram[:-1]))
        buckets = [(str(bound), count) for bound, count in zip(LATENCY_BUCKETS, counts, strict=False)]
        family.add_metric([value], [*buckets, ("+Inf", counts[-1])], sum_value=histogram[-1])
    return family


def _lane_running(kind: StepKind) -> Callable[[Orchestrator], float]:
    return lambda engine: float(engine.lanes[kind].running)
