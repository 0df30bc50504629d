"""The app's metrics: tallies kept on the loop come out of a scrape as Prometheus counters and histograms."""

from __future__ import annotations

import gc

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sessionrl.service.metrics import LATENCY_BUCKETS, Metrics


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and sorted labels."""
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_requests_are_counted_by_method_route_and_status() -> None:
    metrics = Metrics()
    for status in (200, 200, 409):
        metrics.answered("POST", "/v1/sessions/{session_id}/steps", status, 0.002)
    samples = scrape(metrics)
    route = ("route", "/v1/sessions/{session_id}/steps")
    assert samples["sessionrl_http_requests_total", (("method", "POST"), route, ("status", "200"))] == 2
    assert samples["sessionrl_http_requests_total", (("method", "POST"), route, ("status", "409"))] == 1


def test_latency_buckets_are_cumulative_with_a_sum_and_an_inf_bucket() -> None:
    metrics = Metrics()
    for seconds in (0.001, 0.003, 0.2, 30.0):  # 0.001 sits on a bound: it counts in that bucket
        metrics.answered("GET", "/healthz", 200, seconds)
    samples = scrape(metrics)

    def bucket(le: str) -> float:
        return samples["sessionrl_http_request_seconds_bucket", (("le", le), ("route", "/healthz"))]

    assert bucket("0.001") == 1
    assert bucket("0.0025") == 1
    assert bucket("0.005") == 2
    assert bucket("0.25") == 3
    assert bucket(str(LATENCY_BUCKETS[-1])) == 3  # 30 s is past every bound
    assert bucket("+Inf") == 4
    assert samples["sessionrl_http_request_seconds_count", (("route", "/healthz"),)] == 4
    assert abs(samples["sessionrl_http_request_seconds_sum", (("route", "/healthz"),)] - 30.204) < 1e-9


def test_steps_are_counted_by_kind_and_outcome() -> None:
    metrics = Metrics()
    metrics.count_step("tool", "ok")
    metrics.count_step("tool", "ok")
    metrics.count_step("plan", "rejected")
    samples = scrape(metrics)
    assert samples["sessionrl_steps_total", (("kind", "tool"), ("outcome", "ok"))] == 2
    assert samples["sessionrl_steps_total", (("kind", "plan"), ("outcome", "rejected"))] == 1
    assert ("sessionrl_steps_total", (("kind", "llm"), ("outcome", "ok"))) not in samples


def test_gc_pauses_are_timed_by_generation_only_while_the_block_is_open() -> None:
    metrics = Metrics()
    callbacks = list(gc.callbacks)
    gc.disable()  # only the collections the test asks for
    try:
        with metrics.gc_pauses():
            gc.collect(2)
            gc.collect(0)
            gc.collect(0)
            during = scrape(metrics)
        assert gc.callbacks == callbacks  # the timer left with the block
        gc.collect(2)
        after = scrape(metrics)
    finally:
        gc.enable()

    def count(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], generation: str) -> float:
        return samples["sessionrl_gc_pause_seconds_count", (("generation", generation),)]

    assert (count(during, "0"), count(during, "1"), count(during, "2")) == (2, 0, 1)
    assert during["sessionrl_gc_pause_seconds_sum", (("generation", "2"),)] > 0
    assert count(after, "2") == 1  # the collection after the block was not timed


def test_plain_routes_are_counted_under_their_path_not_as_unmatched() -> None:
    metrics = Metrics()
    app = FastAPI()  # serves /openapi.json and /docs as plain routes, beside its API routes

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> int:
        return item_id

    with TestClient(metrics.middleware(app)) as client:
        for path in ("/items/3", "/openapi.json", "/docs", "/nowhere"):
            client.get(path)
    counted = [dict(labels) for (name, labels) in scrape(metrics) if name == "sessionrl_http_requests_total"]
    assert sorted(c["route"] for c in counted) == ["/docs", "/items/{item_id}", "/openapi.json", "unmatched"]
