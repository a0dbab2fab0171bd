"""Usage accounting: a job's CPU time charged to its submitter and model; the report by user, by model, as CSV."""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta
from pathlib import Path

from appliance import store
from appliance.data import datasets
from appliance.operations import jobs, jobspec
from appliance.registry import usage
from appliance.store import Store
from tests.conftest import run_cli
from tests.daemon import TINY, Daemon, submit


def test_a_jobs_cpu_time_lands_on_its_submitter_and_model(daemon: Daemon, tmp_path: Path) -> None:
    with store.open(daemon.settings) as opened:
        datasets.import_file(opened, tmp_path / "tickets.csv", name="tickets")
    job_id = submit(daemon, "train", {"dataset": "tickets", "params": TINY, "name": "helpdesk"})
    assert daemon.ended(job_id)["status"] == "finished"

    def usage_by(by: str) -> list[dict]:
        with daemon.api() as api:
            return api.get("/v1/usage", params={"by": by}).json()

    # The job records its own end; the supervisor charges it when it reaps the process, a tick later.
    by_user = daemon.wait(lambda: usage_by("user"), 10, "the job's usage was not recorded")
    by_model = usage_by("model")
    with daemon.api() as api:
        assert api.get("/v1/usage", params={"by": "nobody"}).status_code == 400
    [charged] = [row for row in by_user if row["user"] == "user:local-admin"]
    assert charged["job_attempts"] == 1 and charged["cpu_hours"] * 3600 > 1.0  # torch alone takes seconds to load
    assert charged["gpu_hours"] == 0  # no CUDA here
    [model] = by_model
    assert model["model"] == "helpdesk" and model["cpu_hours"] == charged["cpu_hours"]


def test_gpu_hours_are_wall_time_of_jobs_that_trained_on_cuda(opened: Store) -> None:
    for device, wall_s in (("cuda", 1800.0), ("cpu", 3600.0)):
        job = jobs.submit(opened, jobspec.TrainJob(dataset="tickets", device=device), actor="user:alice")
        usage.record_job(opened, jobs.get(opened, job.id), cpu_s=60.0, wall_s=wall_s)
    [row] = usage.report(opened, by="user")
    assert row["gpu_hours"] == 0.5 and row["cpu_hours"] == round(120 / 3600, 6) and row["job_attempts"] == 2


def test_the_report_by_user_and_by_model_as_csv_and_since_a_day(opened: Store) -> None:
    today, last_week = date.today(), date.today() - timedelta(days=7)
    usage.add(opened, "user:alice", "tickets", cpu_s=3600, job_attempts=1)
    usage.add(opened, "user:bob", "tickets", cpu_s=1800, job_attempts=1)
    usage.add(opened, "user:bob", "invoices", cpu_s=900, job_attempts=1, day=last_week)
    meter = usage.Meter()
    for _ in range(3):
        meter.count("tickets", "key:web", 0.5)
    meter.flush(opened)

    by_model = list(csv.DictReader(io.StringIO(run_cli("usage", "--by", "model", "--csv", check=True).stdout)))
    assert [(row["day"], row["model"], row["cpu_hours"], row["requests"]) for row in by_model] == [
        (last_week.isoformat(), "invoices", "0.25", "0"), (today.isoformat(), "tickets", "1.5", "3")]
    by_user = list(csv.DictReader(io.StringIO(
        run_cli("usage", "--by", "user", "--csv", "--since", today.isoformat(), check=True).stdout)))
    assert {row["user"]: (row["cpu_hours"], row["requests"], row["inference_hours"]) for row in by_user} == {
        "key:web": ("0.0", "3", str(round(1.5 / 3600, 6))), "user:alice": ("1.0", "0", "0.0"),
        "user:bob": ("0.5", "0", "0.0")}
    table = run_cli("usage", check=True).stdout.splitlines()
    assert table[0].split() == ["day", "user", "model", "CPU", "h", "GPU", "h", "jobs", "requests", "inference", "h"]
    assert len(table) == 5
    assert run_cli("usage", "--by", "nobody").returncode == 2
