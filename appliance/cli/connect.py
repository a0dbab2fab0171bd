"""The one way a command reaches the appliance: the running daemon, or the store in this process when none answers.

`connected()` yields a Remote (the daemon's control API: authorised and audited as the
caller's user, long work run as a job the daemon keeps going) or a Local (the store,
opened with the master key; long work runs here, in the foreground). Both answer the
same questions in the same shapes, so a command is written once, whichever it gets.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from appliance import operations, registry
from appliance.cli.base import daemon_client, load_settings, opened_store, progress_bar
from appliance.core.text import whole_number
from appliance.daemon import client
from appliance.data import datasets, sources
from appliance.operations import jobs, jobspec, privacy
from appliance.registry import feedback, usage
from appliance.store import Store, alerts, audit
from appliance.train import runs, studies


class Appliance(Protocol):
    """What a command may ask, of the daemon or of the store; jobs come back as the control API shows them."""

    def import_data(self, path: Path, options: dict[str, Any]) -> tuple[str, bool]: ...
    def import_model(self, path: Path, content: bytes | None, options: dict[str, Any]) -> dict[str, Any]:
        """The model at path (or content read from it: a decrypted archive) checked and stored; its version."""
    def datasets(self) -> list[dict[str, Any]]: ...
    def dataset(self, ref: str) -> dict[str, Any]: ...
    def models(self) -> list[dict[str, Any]]: ...
    def model(self, ref: str) -> dict[str, Any]: ...
    def runs(self) -> list[dict[str, Any]]: ...
    def run_detail(self, run_id: str) -> dict[str, Any]: ...
    def studies(self) -> list[dict[str, Any]]: ...
    def study(self, study_id: str) -> dict[str, Any]: ...
    def usage(self, since: str | None, by: str | None) -> list[dict[str, Any]]: ...
    def quality(self, model: str | None) -> list[dict[str, Any]]: ...
    def audit_records(self, since: str | None, actor: str | None, action: str | None,
                      limit: int | None) -> list[dict[str, Any]]: ...
    def set_residency(self, ref: str, residency: str) -> list[str]: ...
    def delete_dataset(self, ref: str) -> list[str]: ...
    def delete_model(self, ref: str) -> str: ...
    def delete_job(self, job_id: str) -> dict[str, Any]: ...
    def discard_run(self, run_id: str) -> dict[str, Any]: ...  # the run, with the bytes its checkpoint freed
    def deploy(self, ref: str, canary_percent: float | None) -> tuple[str, str]: ...
    def rollback(self, model: str) -> operations.Rollback: ...
    def record_feedback(self, pairs: list[tuple[str, str]], source: str) -> dict[str, Any]: ...
    def erasure(self, subject: str, *, dry_run: bool) -> dict[str, Any]: ...
    def jobs(self, status: str | None) -> list[dict[str, Any]]: ...
    def job(self, job_id: str) -> dict[str, Any]: ...
    def job_logs(self, job_id: str) -> list[str]: ...
    def submit(self, spec: jobspec.Spec, priority: int) -> dict[str, Any]: ...
    def cancel(self, job_id: str) -> dict[str, Any]: ...
    def alerts(self, *, acknowledged: bool) -> list[dict[str, Any]]: ...
    def acknowledge(self, alert_id: int) -> dict[str, Any]: ...
    def run(self, spec: jobspec.Spec, label: str, base: Path | None = None) -> dict[str, Any]: ...
    def export(self, spec: jobspec.ExportJob) -> bytes: ...  # the signed archive, in plaintext: encrypt it here


class Remote:
    """The running daemon, through its control API."""

    def __init__(self, api: client.Client) -> None:
        self.api = api

    def import_data(self, path: Path, options: dict[str, Any]) -> tuple[str, bool]:
        answer = self._send(path, None, options, client.DATASETS, "checking")
        return f"{answer['name']}:{answer['version']}", answer["unchanged"]

    def import_model(self, path: Path, content: bytes | None, options: dict[str, Any]) -> dict[str, Any]:
        return self._send(path, content, options, client.MODELS, "checking and measuring")

    def _send(self, path: Path, content: bytes | None, options: dict[str, Any], to: str, then: str) -> Any:
        """An upload on a progress bar, which says `then` once every byte is sent and the daemon is at work."""
        total = len(content) if content is not None else sources.LocalPath(path).size()
        with progress_bar(f"sending {path.name}") as progress:
            done = 0

            def sent(size: int) -> None:
                nonlocal done
                done += size
                progress(done, total, then if done >= total else None)

            return self.api.upload(path, options, sent, to=to, content=content)

    def datasets(self) -> list[dict[str, Any]]:
        return self.api.get("/v1/datasets")

    def dataset(self, ref: str) -> dict[str, Any]:
        return self.api.get(client.path("/v1/datasets/{}/detail", ref))

    def models(self) -> list[dict[str, Any]]:
        return self.api.get("/v1/models")

    def model(self, ref: str) -> dict[str, Any]:
        return self.api.get(client.path("/v1/models/{}", ref))

    def runs(self) -> list[dict[str, Any]]:
        return self.api.get("/v1/runs")

    def run_detail(self, run_id: str) -> dict[str, Any]:
        return self.api.get(client.path("/v1/runs/{}", run_id))

    def studies(self) -> list[dict[str, Any]]:
        return self.api.get("/v1/studies")

    def study(self, study_id: str) -> dict[str, Any]:
        return self.api.get(client.path("/v1/studies/{}", study_id))

    def usage(self, since: str | None, by: str | None) -> list[dict[str, Any]]:
        return self.api.get("/v1/usage", since=since, by=by)

    def quality(self, model: str | None) -> list[dict[str, Any]]:
        return self.api.get("/v1/quality", model=model)

    def audit_records(self, since: str | None, actor: str | None, action: str | None,
                      limit: int | None) -> list[dict[str, Any]]:
        return self.api.get("/v1/audit", since=since, actor=actor, action=action, limit=limit or audit.LIST_MAX)

    def set_residency(self, ref: str, residency: str) -> list[str]:
        return [f"{version['name']}:{version['version']}"
                for version in self.api.post(client.path("/v1/datasets/{}/residency", ref), {"residency": residency})]

    def delete_dataset(self, ref: str) -> list[str]:
        return [version["ref"] for version in self.api.delete(client.path("/v1/datasets/{}/content", ref))]

    def delete_model(self, ref: str) -> str:
        model, _, number = ref.partition(":")
        answer = self.api.delete(client.path("/v1/models/{}/versions/{}", model, number))
        return f"{answer['model']}:{answer['version']}"

    def delete_job(self, job_id: str) -> dict[str, Any]:
        return self.api.delete(client.path("/v1/jobs/{}", job_id))

    def discard_run(self, run_id: str) -> dict[str, Any]:
        return self.api.delete(client.path("/v1/runs/{}/checkpoint", run_id))

    def deploy(self, ref: str, canary_percent: float | None) -> tuple[str, str]:
        model, _, number = ref.partition(":")
        version = whole_number(number)
        body = {"canary_percent": canary_percent} | ({"version": version} if version is not None else {})
        answer = self.api.post(client.path("/v1/models/{}/deploy", model), body)
        return answer["model"], f"{answer['model']}:{answer['version']}"

    def rollback(self, model: str) -> operations.Rollback:
        answer = self.api.post(client.path("/v1/models/{}/rollback", model))
        return operations.Rollback(model, "canary" in answer, answer.get("production"))

    def record_feedback(self, pairs: list[tuple[str, str]], source: str) -> dict[str, Any]:
        return self.api.post("/v1/feedback", {"feedback": [{"prediction_id": p, "label": label} for p, label in pairs],
                                              "source": source})

    def erasure(self, subject: str, *, dry_run: bool) -> dict[str, Any]:
        return self.api.post("/v1/privacy/erase", {"subject": subject, "dry_run": dry_run})

    def jobs(self, status: str | None) -> list[dict[str, Any]]:
        return self.api.get("/v1/jobs", status=status)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.api.get(client.path("/v1/jobs/{}", job_id))

    def job_logs(self, job_id: str) -> list[str]:
        return self.api.get(client.path("/v1/jobs/{}/logs", job_id))

    def submit(self, spec: jobspec.Spec, priority: int) -> dict[str, Any]:
        return self.api.post("/v1/jobs", spec.body(priority))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.api.post(client.path("/v1/jobs/{}/cancel", job_id))

    def alerts(self, *, acknowledged: bool) -> list[dict[str, Any]]:
        return self.api.get("/v1/alerts", all=acknowledged)

    def acknowledge(self, alert_id: int) -> dict[str, Any]:
        return self.api.post(client.path("/v1/alerts/{}/acknowledge", alert_id))

    def run(self, spec: jobspec.Spec, label: str, base: Path | None = None) -> dict[str, Any]:
        """The spec as a job the daemon runs, followed to its end; a base folder goes by its name in
        train.base_models_dir (JobError for any other)."""
        from appliance.cli.jobs import run_job

        named = jobspec.base_name(base, load_settings()) if base is not None else None
        if named is not None:
            spec = type(spec).parse(spec.dump() | {"base": named})
        return run_job(self.api, spec)

    def export(self, spec: jobspec.ExportJob) -> bytes:
        """An export job, followed to its end; then its archive, handed over once."""
        from appliance.cli.jobs import result_of

        job = self.api.post("/v1/jobs", spec.body())
        result_of(self.api, job)
        return self.api.download(client.path("/v1/exports/{}", job['id']))


class Local:
    """The store, in this process: what the daemon would do, done here and audited as this user."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def import_data(self, path: Path, options: dict[str, Any]) -> tuple[str, bool]:
        known = {version.id for version in datasets.list_versions(self.store)}
        with progress_bar(f"reading {path.name}") as progress:
            version = datasets.import_file(self.store, path, progress=progress, **options)
        return version.ref, version.id in known

    def import_model(self, path: Path, content: bytes | None, options: dict[str, Any]) -> dict[str, Any]:
        from appliance.operations import imports  # torch and OpenVINO load for an import only

        source = sources.LocalPath(path) if content is None else sources.Upload(path.name, content, folder=False)
        with progress_bar(f"importing {path.name}") as progress:
            version = imports.import_model(lambda: nullcontext(self.store), source, **options, progress=progress,
                                           actor=audit.default_actor())
        return registry.describe(self.store, version.ref)

    def datasets(self) -> list[dict[str, Any]]:
        return [version.summary() for version in datasets.list_versions(self.store)]

    def dataset(self, ref: str) -> dict[str, Any]:
        return operations.describe_dataset(self.store, ref)

    def models(self) -> list[dict[str, Any]]:
        return [version.summary() for version in registry.list_versions(self.store)]

    def model(self, ref: str) -> dict[str, Any]:
        return registry.describe(self.store, ref)

    def runs(self) -> list[dict[str, Any]]:
        return [asdict(run) for run in runs.list_runs(self.store)]

    def run_detail(self, run_id: str) -> dict[str, Any]:
        return runs.describe(self.store, run_id)

    def studies(self) -> list[dict[str, Any]]:
        return studies.summaries(self.store)

    def study(self, study_id: str) -> dict[str, Any]:
        return studies.describe(self.store, study_id)

    def usage(self, since: str | None, by: str | None) -> list[dict[str, Any]]:
        return usage.report(self.store, audit.parse_since(since).date() if since else None, by)

    def quality(self, model: str | None) -> list[dict[str, Any]]:
        return feedback.report(self.store, model)

    def audit_records(self, since: str | None, actor: str | None, action: str | None,
                      limit: int | None) -> list[dict[str, Any]]:
        return audit.records(self.store, since=audit.parse_since(since) if since else None, actor=actor,
                             action=action, limit=limit)

    def set_residency(self, ref: str, residency: str) -> list[str]:
        return [version.ref for version in datasets.set_residency(self.store, ref, residency)]

    def delete_dataset(self, ref: str) -> list[str]:
        return [version.ref for version in operations.delete_dataset(self.store, ref)]

    def delete_model(self, ref: str) -> str:
        return registry.delete(self.store, ref).ref

    def delete_job(self, job_id: str) -> dict[str, Any]:
        return asdict(jobs.delete(self.store, job_id))

    def discard_run(self, run_id: str) -> dict[str, Any]:
        run, freed = operations.discard_run(self.store, run_id)
        return {**asdict(run), "freed_bytes": freed}

    def deploy(self, ref: str, canary_percent: float | None) -> tuple[str, str]:
        version = registry.deploy(self.store, ref, canary_percent)
        return version.model, version.ref

    def rollback(self, model: str) -> operations.Rollback:
        return operations.rollback(self.store, model)

    def record_feedback(self, pairs: list[tuple[str, str]], source: str) -> dict[str, Any]:
        return feedback.record(self.store, pairs, actor=audit.default_actor(), source=source)

    def erasure(self, subject: str, *, dry_run: bool) -> dict[str, Any]:
        return (privacy.find if dry_run else privacy.erase)(self.store, subject).summary()

    def jobs(self, status: str | None) -> list[dict[str, Any]]:
        return [job.shown() for job in jobs.list_jobs(self.store, status)]

    def job(self, job_id: str) -> dict[str, Any]:
        return jobs.get(self.store, job_id).shown()

    def job_logs(self, job_id: str) -> list[str]:
        return jobs.log_lines(self.store, job_id)

    def submit(self, spec: jobspec.Spec, priority: int) -> dict[str, Any]:
        return jobs.submit(self.store, spec, priority).shown()

    def cancel(self, job_id: str) -> dict[str, Any]:
        return jobs.cancel(self.store, job_id).shown()

    def alerts(self, *, acknowledged: bool) -> list[dict[str, Any]]:
        return [asdict(alert) for alert in alerts.listed(self.store, acknowledged=acknowledged)]

    def acknowledge(self, alert_id: int) -> dict[str, Any]:
        return asdict(alerts.acknowledge(self.store, alert_id, audit.default_actor()))

    def run(self, spec: jobspec.Spec, label: str, base: Path | None = None) -> dict[str, Any]:
        """The spec's operations here, on a progress bar; a stop (SIGTERM, Ctrl-C) checkpoints and raises Stopped.
        base may be any model folder this user can read."""
        from appliance.cli.jobs import foreground

        with foreground(self.store, label, stoppable=not isinstance(spec, jobspec.OptimizeJob)) as here:
            return operations.run(here, spec, base=base)

    def export(self, spec: jobspec.ExportJob) -> bytes:
        """The archive, made here (audited as this user): it never rests in the store."""
        from appliance.registry import exchange

        with progress_bar(f"exporting {spec.version} as {spec.format}") as bar:
            bar(0, 1, "export")
            exported = exchange.export(self.store, spec.version, spec.format, spec.protection,
                                       actor=audit.default_actor())
        return exported.archive


@contextmanager
def connected() -> Iterator[Appliance]:
    """The daemon when one answers, else the store opened here."""
    with daemon_client() as api:
        if api is not None:
            yield Remote(api)
            return
    with opened_store() as opened:
        yield Local(opened)
