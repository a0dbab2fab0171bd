"""`appliance quickstart`: from a fresh clone to a fine-tuned model, on embedded defaults.

It creates the master key and the store on first use, imports the sample dataset
that ships with the appliance, fine-tunes the bundled base model on it, and optimises
the result for this box (OpenVINO, INT8 under the accuracy guard) into the registry.
Running it again reuses what the first run made: the key, the dataset version, a
finished run (an interrupted one is resumed) and its optimised version.
"""

from __future__ import annotations

import os
from importlib import resources

import click

from appliance import datasets, registry
from appliance.cli.audit import show_verification
from appliance.cli.base import cli, load_settings, opened_store, progress_bar
from appliance.cli.models import show_version
from appliance.store import Store, audit, lifecycle
from appliance.train import runs
from appliance.train.params import TrainParams

SAMPLE_NAME = "sample-tickets"


@cli.command()
def quickstart() -> None:
    """Set up the store, import the sample dataset, fine-tune the bundled model on it and optimise the result."""
    from appliance.train import engine  # torch loads only when training

    settings = load_settings()
    if not settings.key_file.exists() and not os.environ.get("APPLIANCE_PASSPHRASE"):
        with lifecycle.init(settings):
            click.echo(f"created the master key at {settings.key_file} (mode 0600)")
            click.echo("  back it up somewhere safe: without it nothing in the store can be read")
    with opened_store() as opened:
        with resources.as_file(resources.files("appliance.samples") / "support_tickets.csv") as sample:
            version = datasets.import_file(opened, sample, name=SAMPLE_NAME)
        click.echo(f"dataset {version.ref}: {version.examples} examples, labels {', '.join(version.labels)}")

        earlier = [run for run in runs.list_runs(opened) if run.dataset_id == version.id]
        finished = [run for run in earlier if run.status == "finished"]
        if finished:
            run_id, metrics = finished[-1].id, finished[-1].metrics or {}
            click.echo(f"reusing the finished run {run_id}")
        else:
            with progress_bar("training") as bar:

                def show(report: engine.Progress) -> None:
                    bar(report.step, report.total_steps, f"epoch {report.epoch}/{report.epochs} {report.phase}")

                if earlier:
                    result = engine.resume(opened, earlier[-1].id, progress=show)
                else:
                    result = engine.start(
                        opened, dataset=version.ref, base_dir=settings.base_model, params=TrainParams(), progress=show
                    )
            run_id, metrics = result.run_id, result.metrics
        click.echo(
            f"run {run_id}: validation accuracy {metrics.get('accuracy', 0):.3f},"
            f" macro-F1 {metrics.get('macro_f1', 0):.3f}"
        )
        version = _optimized(opened, run_id)
        if "production" not in version.aliases:
            version = registry.deploy(opened, version.ref)
        show_version(version, version.lineage(opened))
        show_verification(audit.verify(opened))
    click.echo(f"next: 'appliance api-keys create NAME', then 'appliance serve' answers on "
               f"http://127.0.0.1:8080/v1/models/{version.model}:predict")


def _optimized(opened: Store, run_id: str) -> registry.ModelVersion:
    """The run's optimised version: found from an earlier quickstart, or registered and optimised now."""
    from appliance import pipeline

    versions = [v for v in registry.list_versions(opened) if v.run_id == run_id]
    done = [v for v in versions if len(v.variants) > 1]
    if done:
        click.echo(f"reusing the optimised version {done[-1].ref}")
        return done[-1]
    registered = versions[-1] if versions else pipeline.register_run(opened, run_id, SAMPLE_NAME)
    with progress_bar("optimising") as bar:
        return pipeline.optimize_version(opened, registered.ref, progress=bar)
