"""Prometheus metrics of the inference server, labelled by model and version.

One registry per server (not the process-wide default), so two servers in one
process, as in tests, do not share counters.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
OTHER = "_other"  # the model label of requests naming no served model: a caller cannot add series at will
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def quantile_s(before: list[float], after: list[float], q: float) -> tuple[float, int]:
    """The bucket bound under which a share q of the requests between two latency_counts() fell, and their number.

    Requests slower than the last bound count as twice that bound: enough to say "too slow".
    """
    index, total = _bucket_of(before, after, q)
    return (LATENCY_BUCKETS[index] if index < len(LATENCY_BUCKETS) else 2 * LATENCY_BUCKETS[-1]), total


def estimate_quantile_s(before: list[float], after: list[float], q: float) -> float | None:
    """The latency a share q of the requests between two counts stayed under, interpolated inside its bucket
    as Prometheus' histogram_quantile() does; None when there were no requests."""
    index, total = _bucket_of(before, after, q)
    if total == 0:
        return None
    if index == len(LATENCY_BUCKETS):  # slower than the last bound: that bound is all we know
        return LATENCY_BUCKETS[-1]
    lower = LATENCY_BUCKETS[index - 1] if index else 0.0
    below = after[index - 1] - before[index - 1] if index else 0.0
    inside = after[index] - before[index] - below
    share = (q * total - below) / inside if inside else 1.0
    return lower + (LATENCY_BUCKETS[index] - lower) * share


def _bucket_of(before: list[float], after: list[float], q: float) -> tuple[int, int]:
    """The first bucket whose cumulative count reaches a share q of the requests between two counts, and their number."""
    total = after[-1] - before[-1]
    for index, (old, new) in enumerate(zip(before[:-1], after[:-1], strict=True)):
        if new - old >= q * total:
            return index, int(total)
    return len(LATENCY_BUCKETS), int(total)


@dataclass(frozen=True)
class Counts:
    """What one model version has answered so far: requests by status, latencies as cumulative bucket counts."""

    by_status: dict[str, float]
    latency: list[float]  # one count per bound of LATENCY_BUCKETS, then all requests

    @classmethod
    def zero(cls) -> Counts:
        return cls({}, [0.0] * (len(LATENCY_BUCKETS) + 1))

    @property
    def failed(self) -> float:
        """Requests the server failed (5xx). A refusal (4xx) is the caller's doing: bad requests never count as errors."""
        return sum(count for status, count in self.by_status.items() if status.startswith("5"))

    @property
    def refused(self) -> float:
        """Requests refused as the caller's fault (4xx)."""
        return sum(count for status, count in self.by_status.items() if status.startswith("4"))

    def __add__(self, other: Counts) -> Counts:
        statuses = self.by_status.keys() | other.by_status.keys()
        return Counts({s: self.by_status.get(s, 0.0) + other.by_status.get(s, 0.0) for s in statuses},
                      [a + b for a, b in zip(self.latency, other.latency, strict=True)])


class Metrics:
    """The server's counters, histograms and gauges, and their text exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("appliance_requests_total", "Requests answered, by model, version and status.",
                                ["model", "version", "status"], registry=self.registry)
        self.latency = Histogram("appliance_request_seconds", "Time to answer an inference request.",
                                 ["model", "version"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("appliance_batch_size", "Texts per inference.", ["model", "version"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram("appliance_batch_seconds", "Time of one inference on the device.",
                                       ["model", "version"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("appliance_queue_depth", "Texts accepted and not yet answered.",
                                 ["model", "version"], registry=self.registry)
        self.drift_psi = Gauge("appliance_drift_psi", "Population stability index of the last full window.",
                               ["model", "version", "feature"], registry=self.registry)
        self.traffic = Gauge("appliance_traffic_share", "Share of a model's traffic each version gets (0-1).",
                             ["model", "version"], registry=self.registry)
        self.feedback_accuracy = Gauge("appliance_feedback_accuracy",
                                       "Share of predictions made in the window that feedback says were right.",
                                       ["model", "version", "window"], registry=self.registry)
        self.feedback_count = Gauge("appliance_feedback_labels", "True labels on predictions made in the window.",
                                    ["model", "version", "window"], registry=self.registry)
        self.predictions_dropped = Gauge("appliance_predictions_dropped",
                                         "Predictions not kept because the store fell behind.", registry=self.registry)

    def request(self, model: str, version: int | None, status: int, seconds: float | None = None) -> None:
        labels = (model, str(version) if version is not None else "", str(status))
        self.requests.labels(*labels).inc()
        if seconds is not None and version is not None:
            self.latency.labels(model, str(version)).observe(seconds)

    def batch(self, model: str, version: int, texts: int, seconds: float) -> None:
        self.batch_size.labels(model, str(version)).observe(texts)
        self.batch_seconds.labels(model, str(version)).observe(seconds)

    def drift(self, model: str, version: int, scores: dict[str, float]) -> None:
        for feature, value in scores.items():
            self.drift_psi.labels(model, str(version), feature).set(value)

    def quality(self, by_version: list[dict[str, Any]]) -> None:
        """Live accuracy on feedback (feedback.quality()'s answer) into the gauges."""
        for entry in by_version:
            for window, found in entry["windows"].items():
                labels = (entry["model"], str(entry["version"]), window)
                self.feedback_count.labels(*labels).set(found["feedback"])
                if found["accuracy"] is not None:
                    self.feedback_accuracy.labels(*labels).set(found["accuracy"])

    def forget(self, model: str, version: int) -> None:
        """A version left service: its gauges go, its counters stay (they only ever grow)."""
        for gauge in (self.queue_depth, self.traffic):
            try:
                gauge.remove(model, str(version))
            except KeyError:
                pass

    def counts(self) -> dict[tuple[str, str], Counts]:
        """Requests and latencies so far, by (model, version); version "" holds requests refused before routing."""
        found: dict[tuple[str, str], Counts] = {}

        def entry(labels: dict[str, str]) -> Counts:
            return found.setdefault((labels["model"], labels["version"]), Counts.zero())

        for metric in self.requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    entry(sample.labels).by_status[sample.labels["status"]] = sample.value
        for metric in self.latency.collect():
            for sample in metric.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    index = LATENCY_BUCKETS.index(bound) if bound in LATENCY_BUCKETS else -1
                    entry(sample.labels).latency[index] = sample.value
        return found

    def latency_counts(self) -> list[float]:
        """Requests so far at or under each latency bound, all models together (cumulative); the last is all."""
        return sum(self.counts().values(), Counts.zero()).latency

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class TrafficWindow:
    """Request rates, error rates and latency quantiles over about the last `span_s` seconds.

    A snapshot of the counters is kept at each sample() (the daemon takes one a second)
    and each summary(); an answer compares now with the oldest snapshot still inside the
    span, so it covers the trailing minute however rarely anyone asks. Until a span has
    passed since the first snapshot, it covers the time since then, and says so.
    """

    def __init__(self, metrics: Metrics, span_s: float = 60.0) -> None:
        self.metrics, self.span_s = metrics, span_s
        self._snapshots: deque[tuple[float, dict[tuple[str, str], Counts]]] = deque()

    def sample(self) -> tuple[float, dict[tuple[str, str], Counts]]:
        """Keep a snapshot of the counters now; drop those the span no longer needs. Returns the snapshot."""
        now, current = time.monotonic(), _with_totals(self.metrics.counts())
        while len(self._snapshots) > 1 and now - self._snapshots[1][0] >= self.span_s:
            self._snapshots.popleft()  # keep the newest snapshot that still covers the whole span
        self._snapshots.append((now, current))
        return now, current

    def summary(self) -> tuple[float, dict[tuple[str, str], dict[str, Any]]]:
        """(seconds covered, stats by (model, version), and by (model, "all") for all its requests, refused ones too);
        0 seconds and rates of None on the first call."""
        now, current = self.sample()
        since, before = self._snapshots[0]
        seconds = now - since
        return seconds, {key: _stats(before.get(key, Counts.zero()), counts, seconds) for key, counts in current.items()}


def _with_totals(counts: dict[tuple[str, str], Counts]) -> dict[tuple[str, str], Counts]:
    totals: dict[tuple[str, str], Counts] = {}
    for (model, _version), found in counts.items():
        totals[(model, "all")] = totals.get((model, "all"), Counts.zero()) + found
    return counts | totals


def _stats(before: Counts, after: Counts, seconds: float) -> dict[str, Any]:
    """Rates between two counts; the error rate is the share of the requests the server had to answer (all but the
    refused ones) that it failed, so neither a caller's bad requests nor its refusals move it."""
    requests = sum(after.by_status.values()) - sum(before.by_status.values())
    errors = after.failed - before.failed
    answerable = requests - (after.refused - before.refused)
    p50, p99 = (estimate_quantile_s(before.latency, after.latency, q) for q in (0.5, 0.99))
    return {
        "requests": int(sum(after.by_status.values())),
        "requests_per_s": requests / seconds if seconds > 0 else None,
        "error_rate": errors / answerable if answerable else None,
        "p50_ms": p50 * 1000 if p50 is not None else None,
        "p99_ms": p99 * 1000 if p99 is not None else None,
    }
