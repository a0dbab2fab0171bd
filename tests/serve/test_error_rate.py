"""Error rates count only the server's failures (5xx): a caller's bad requests are its own doing."""

from __future__ import annotations

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
