"""Error rates count only the server's failures (5xx): a caller's bad requests are its own doing."""

from __future__ import annotations

import pytest

from appliance.core import config
from appliance.operations import autopilot
from appliance.registry import feedback
from appliance.serve import metrics
from appliance.serve.metrics import LATENCY_BUCKETS, Counts

POLICY = config.Policy(enabled=True, canary_min_feedback=30)


def answered(ok: int, **refusals: int) -> Counts:
    """ok answers under 4 ms, and refusals or failures by status ("s400": 900)."""
    latency = [float(ok) if bound >= 0.004 else 0.0 for bound in LATENCY_BUCKETS] + [float(ok)]
    return Counts({"200": float(ok)} | {status[1:]: float(n) for status, n in refusals.items()}, latency)


def test_refusals_neither_raise_nor_dilute_the_error_rate() -> None:
    stats = metrics._stats(Counts.zero(), answered(95, s400=900, s413=50, s429=40, s503=5), 10.0)
    assert stats["error_rate"] == 0.05 and stats["requests"] == 1090
    assert metrics._stats(Counts.zero(), answered(100, s400=5000), 10.0)["error_rate"] == 0.0


def test_a_canary_flooded_with_bad_requests_is_not_rolled_back() -> None:
    nothing = feedback.Evidence(0, 0)
    flooded = autopilot.judge(nothing, nothing, POLICY, answered(100), answered(100, s400=5000, s413=500))
    assert flooded.decision == "wait" and flooded.evidence["guards"]["error_rate"] == 0.0
    failing = autopilot.judge(nothing, nothing, POLICY, answered(100), answered(100, s503=5))
    assert failing.decision == "rollback" and "failed 4.8% of 105 requests" in failing.reason


def test_rates_cover_the_last_minute_however_rarely_someone_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dashboard opened after a quiet hour once read a rate averaged over that hour, labelled as recent."""
    clock = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    served = metrics.Metrics()
    window = metrics.TrafficWindow(served, span_s=60)
    assert window.summary()[0] == 0  # the first reading: nothing to compare with yet
    for _ in range(400):  # the daemon samples each second; nobody asks
        clock[0] += 1
        served.request("tickets", 2, 200, 0.003)
        window.sample()
    seconds, stats = window.summary()
    assert 60 <= seconds < 62 and stats[("tickets", "2")]["requests_per_s"] == pytest.approx(1.0, rel=0.03)
