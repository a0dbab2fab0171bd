"""Alerts: what needs an operator's eye stays, across restarts, until someone acknowledges it, on the record."""

from __future__ import annotations

import json

import pytest

from appliance import store
from appliance.access import users
from appliance.core.errors import AlertNotFound
from appliance.store import Store, alerts, audit, events
from tests.daemon import Daemon, submit


def test_the_same_trouble_raised_again_is_one_alert_until_acknowledged(opened: Store) -> None:
    first = alerts.raise_alert(opened, "drift", "tickets", "warning", "tickets:2 drifted (length PSI 0.31)")
    again = alerts.raise_alert(opened, "drift", "tickets", "warning", "tickets:2 drifted (length PSI 0.44)")
    other = alerts.raise_alert(opened, "job", "abc123", "error", "job abc123 failed")
    assert again.id == first.id and again.count == 2 and again.message.endswith("0.44)")
    assert [alert.id for alert in alerts.listed(opened)] == [other.id, first.id] and alerts.open_count(opened) == 2

    seen = alerts.acknowledge(opened, first.id, "user:ops")
    assert (seen.acknowledged_by, alerts.open_count(opened)) == ("user:ops", 1)
    assert alerts.acknowledge(opened, first.id, "user:someone-else").acknowledged_by == "user:ops"  # once
    records = audit.rows(opened, action="alert.acknowledge")
    assert [(row["actor"], row["object"]) for row in records] == [("user:ops", str(first.id))]
    assert json.loads(records[0]["details"]) == {"source": "drift", "subject": "tickets"}

    reopened = alerts.raise_alert(opened, "drift", "tickets", "warning", "tickets:2 drifted again")
    assert reopened.id != first.id and reopened.count == 1  # a new episode, not the one already seen
    assert len(alerts.listed(opened, acknowledged=True)) == 3
    kinds = [(e.topic, e.kind) for e in events.after(opened, 0, None, 100)]
    assert kinds.count(("alert", "raised")) == 4 and kinds.count(("alert", "acknowledged")) == 1
    for unknown in (999, 10**21):  # the second beyond what SQLite holds
        with pytest.raises(AlertNotFound, match=f"no alert {unknown}"):
            alerts.acknowledge(opened, unknown, "user:ops")


def test_a_failed_job_is_an_alert_that_outlives_a_restart_until_an_operator_acknowledges_it(daemon: Daemon) -> None:
    job_id = submit(daemon, "train", {"dataset": "no-such-dataset"})
    assert daemon.ended(job_id)["status"] == "failed"
    listed = daemon.cli("alerts")
    assert listed.returncode == 0, listed.stderr
    assert f"job {job_id} (train) failed" in listed.stdout and f"'appliance jobs logs {job_id}'" in listed.stdout

    daemon.stop()
    daemon.start()
    with daemon.api() as api:
        (alert,) = api.get("/v1/alerts").json()
        assert (alert["source"], alert["subject"], alert["severity"]) == ("job", job_id, "error")
        assert api.get("/v1/status").json()["open_alerts"] == 1
    with store.open(daemon.settings) as opened:
        _, viewer = users.add(opened, "auditor", "viewer")
    with daemon.api(viewer) as api:
        refused = api.post(f"/v1/alerts/{alert['id']}/acknowledge")
        assert refused.status_code == 403 and api.get("/v1/alerts").json() == [alert]  # a viewer sees, cannot clear

    acknowledged = daemon.cli("alerts", "ack", str(alert["id"]))
    assert acknowledged.returncode == 0 and f"alert {alert['id']} acknowledged" in acknowledged.stdout
    assert "no open alerts" in daemon.cli("alerts").stdout
    everything = json.loads(daemon.cli("alerts", "--all", "--json").stdout)
    assert [a["acknowledged_by"] for a in everything] == [f"user:{users.LOCAL_ADMIN}"]
    unknown = daemon.cli("alerts", "ack", "999")
    assert unknown.returncode == 1 and "no alert 999" in unknown.stderr
