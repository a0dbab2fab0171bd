"""Deleting what an operator no longer wants: a dataset's content, a model version, an ended job; through the
daemon as people do it, refused while something still needs it, and on the record. And reading all of it from
the shell as a user who holds a token but not the store's key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from appliance import operations, registry, store
from appliance.access import users
from appliance.core.errors import DatasetError
from appliance.data import datasets
from appliance.operations import jobs, jobspec
from appliance.store import Store, audit, blobs
from appliance.train import runs
from tests.conftest import write_tickets
from tests.daemon import Daemon, submit


def test_a_dataset_a_queued_job_trains_on_is_not_deleted(opened: Store, tmp_path: Path) -> None:
    write_tickets(tmp_path / "tickets.csv")
    datasets.import_file(opened, tmp_path / "tickets.csv", name="tickets")
    job = jobs.submit(opened, jobspec.TrainJob(dataset="tickets:1"), actor="user:alice")
    with pytest.raises(DatasetError, match=f"jobs {job.id} train on tickets, so nothing was deleted"):
        operations.delete_dataset(opened, "tickets")
    assert datasets.get(opened, "tickets").removal is None

    jobs.cancel(opened, job.id)
    (deleted,) = operations.delete_dataset(opened, "tickets", actor="user:admin")
    assert deleted.removal is not None and deleted.removal.endswith("by user:admin")


def test_an_operator_reads_everything_through_the_daemon_and_only_an_admin_deletes(
        daemon: Daemon, tmp_path: Path) -> None:
    # The same file under a second name is a dataset of its own (the README's example after the quickstart).
    for name in ("tickets", "tickets-copy"):
        imported = daemon.cli("data", "import", str(tmp_path / "tickets.csv"), "--name", name)
        assert imported.returncode == 0 and f"imported as {name}:1" in imported.stdout, imported.stderr
    with store.open(daemon.settings) as opened:
        _, operator = users.add(opened, "ops", "operator")
        run_id = runs.create(opened, dataset_id=datasets.get(opened, "tickets").id, base_model="tiny",
                             task=datasets.TEXT, params={}, plan={})
        weights = blobs.put(opened, b"weights")
        registry.register(opened, "tickets", run_id=run_id, task=datasets.TEXT, chosen="fp32", reason="only one",
                          variants=[registry.Variant("fp32", "torch-bundle", weights, 7, {})])

    # An operator at the shell reads all of it through the daemon, with no key to open the store themselves.
    as_operator = {**daemon.env, "APPLIANCE_TOKEN": operator, "APPLIANCE_KEYS_FILE": str(tmp_path / "no.key")}
    shown = _cli(as_operator, "data", "show", "tickets")
    assert "trained     tickets:1" in shown.stdout and "billing" in shown.stdout, shown.stderr
    assert "tickets-copy:1" in _cli(as_operator, "data", "list").stdout
    assert "not optimised" in _cli(as_operator, "models", "list").stdout
    assert "lineage: run " in _cli(as_operator, "models", "show", "tickets:1").stdout
    assert f"{run_id}  " in _cli(as_operator, "runs", "list").stdout
    assert f"run {run_id}: " in _cli(as_operator, "runs", "show", run_id).stdout
    assert "no searches yet" in _cli(as_operator, "tune", "list").stdout
    assert "no feedback yet" in _cli(as_operator, "feedback", "show").stdout
    assert _cli(as_operator, "usage", "--since", "7d").returncode == 0
    assert " dataset.import " in _cli(as_operator, "audit", "list", "--action", "dataset.*").stdout
    assert _cli(as_operator, "usage", "--since", "yesterday").returncode == 2  # told here, before anything is asked
    refused = _cli(as_operator, "data", "delete", "tickets", "--yes")
    assert refused.returncode == 1 and "needs admin" in refused.stderr
    with daemon.api(operator) as api:
        detail = api.get("/v1/datasets/tickets/detail").json()  # what a viewer may see of it
        assert api.get("/v1/models/tickets@candidate").status_code == 404  # no canary runs
        assert detail["models"] == ["tickets:1"] and sum(detail["counts"].values()) == detail["examples"]
        for path in ("/v1/datasets/tickets/content", "/v1/models/tickets/versions/1"):
            refused = api.delete(path)
            assert refused.status_code == 403 and "needs admin" in refused.json()["error"], path

    # Without a terminal to ask at, the CLI wants --yes; with it, the content goes and the rows say who.
    unasked = daemon.cli("data", "delete", "tickets")
    assert unasked.returncode == 2 and "give --yes" in unasked.stderr
    deleted = daemon.cli("data", "rm", "tickets", "--yes")  # rm: delete's other name
    assert deleted.returncode == 0 and deleted.stdout == "deleted tickets:1\n", deleted.stderr
    listed = {v["ref"]: v for v in json.loads(daemon.cli("data", "list", "--json").stdout)}
    assert listed["tickets:1"]["deleted_by"] == f"user:{users.LOCAL_ADMIN}" and listed["tickets:1"]["blob_id"] is None
    assert listed["tickets-copy:1"]["blob_id"] is not None  # shared content stays for the other name
    shown = daemon.cli("data", "show", "tickets:1")
    assert shown.returncode == 0 and "deleted on " in shown.stdout
    training = daemon.ended(submit(daemon, "train", {"dataset": "tickets:1"}))
    assert training["status"] == "failed" and "tickets:1 was deleted on" in training["error"]

    # A model version goes with its weights; its number then says what happened to it.
    assert daemon.cli("models", "rm", "tickets:1", "--yes").stdout == "deleted tickets:1\n"
    with daemon.api() as api:
        gone = api.get("/v1/models")
        assert gone.json() == []
        again = api.delete("/v1/models/tickets/versions/1")
        assert again.status_code == 404 and "tickets:1 was deleted on" in again.json()["error"]
        refused = api.delete("/v1/models/tickets/versions/0")
        assert refused.status_code == 400 and "version" in refused.json()["error"], refused.text

        # An ended job is forgotten with its log; a second delete finds nothing.
        assert api.delete(f"/v1/jobs/{training['id']}").status_code == 200
        assert api.get(f"/v1/jobs/{training['id']}").status_code == 404
    assert daemon.cli("jobs", "delete", training["id"]).returncode == 1

    with store.open(daemon.settings) as opened:
        assert not blobs.exists(opened, weights)
        actions = [(r["action"], r["object"], r["outcome"]) for r in audit.rows(opened)
                   if r["action"] in ("dataset.delete", "model.delete", "job.delete")]
    assert actions == [("dataset.delete", "tickets", "ok"), ("model.delete", "tickets:1", "ok"),
                       ("model.delete", "tickets:1", "failed"), ("job.delete", training["id"], "ok"),
                       ("job.delete", training["id"], "failed")]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_name_typed_for_the_daemon_is_one_segment_of_its_path_never_another_route(daemon: Daemon,
                                                                                   tmp_path: Path) -> None:
    """'no-such/../tickets' deleted tickets, and a job id ending in '../models/tickets/rollback?' rolled a model
    back: the request's path was built from what was typed."""
    write_tickets(tmp_path / "tickets.csv")
    assert daemon.cli("data", "import", str(tmp_path / "tickets.csv"), "--name", "tickets").returncode == 0
    for typed in ("no-such/../tickets", ".."):
        climbing = daemon.cli("data", "delete", "--yes", typed)
        assert climbing.returncode == 1 and "cannot name anything the appliance keeps" in climbing.stderr
    assert "tickets:1" in daemon.cli("data", "list").stdout
    queried = daemon.cli("jobs", "cancel", "x?rollback")
    assert queried.returncode == 1 and "no job with id 'x?rollback'" in queried.stderr, queried.stderr
    not_utf8 = daemon.cli("data", "show", "x\udcff")  # the byte 0xff, as a Latin-1 terminal sends it
    assert not_utf8.returncode == 2 and "is not UTF-8 text" in not_utf8.stderr and "internal" not in not_utf8.stderr
    assert "dataset.delete" not in daemon.cli("audit", "list").stdout
