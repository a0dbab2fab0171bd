"""`appliance models`: the registry's versions, their variants, lineage and aliases; deleting, exporting,
verifying and importing one."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import click

from appliance.cli.audit import check_is_checkpoint
from appliance.cli.base import (
    alias,
    ask,
    cli,
    json_option,
    load_settings,
    passphrase_from,
    print_json,
    say_trust,
    yes_option,
)
from appliance.cli.connect import connected
from appliance.core import files
from appliance.core.errors import RegistryError
from appliance.core.text import whole_number
from appliance.operations.jobspec import ExportJob

PASSPHRASE_ENV = "APPLIANCE_EXPORT_PASSPHRASE"


@cli.group("models")
def models_group() -> None:
    """Registered model versions and which one serves."""


@models_group.command("list")
@json_option
def models_list(as_json: bool) -> None:
    """Every version of every model, with its chosen variant and aliases."""
    with connected() as appliance:
        versions = appliance.models()
    if as_json:
        print_json(versions)
        return
    if not versions:
        click.echo("no models registered yet")
    for v in versions:
        accuracy = v["variants"][v["chosen"]]["metrics"].get("accuracy")
        score = f"accuracy {accuracy:.4f}" if accuracy is not None else ""
        runs_as = f"serves {v['chosen']}" if v["servable"] else "not optimised"
        click.echo(f"{v['model'] + ':' + str(v['version']):<24} {v['created_at']}  {runs_as:<19} {score:<16}"
                   f" {' '.join(v['aliases'])}")


@models_group.command("show")
@click.argument("ref")
@json_option
def models_show(ref: str, as_json: bool) -> None:
    """One version (MODEL, MODEL:VERSION or MODEL@ALIAS): variants side by side, lineage, decision."""
    with connected() as appliance:
        version = appliance.model(ref)
    if as_json:
        print_json(version)
        return
    show_version(version)


@models_group.command("delete")
@click.argument("ref", metavar="MODEL:VERSION")
@yes_option
def models_delete(ref: str, yes: bool) -> None:
    """Delete a version and its weights; audited, admin only.

    Refused while it serves, is the canary's candidate, or a rollback could return to it. Its number is not
    given again; the run it came from and the audit records stay.
    """
    if whole_number(ref.partition(":")[2]) is None:
        raise click.BadParameter("name the version as MODEL:VERSION, e.g. tickets:3", param_hint="MODEL:VERSION")
    ask(f"Delete {ref} and its weights? It cannot be undone.", yes)
    with connected() as appliance:
        click.echo(f"deleted {appliance.delete_model(ref)}")


alias(models_group, models_delete, "rm")


@models_group.command("export")
@click.argument("ref")
@click.option("--format", "fmt", type=click.Choice(["onnx", "openvino", "hf"]), required=True,
              help="onnx; openvino: the IR the version serves (INT8 where the guard chose it); hf: a Hugging Face "
                   "directory (a sentence-transformers one for a model read by the mean of its token states).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The archive to write (a new file, mode 0600).")
@click.option("--recipient", help="Encrypt to this age X25519 public key (age1..., from age-keygen).")
@click.option("--passphrase", "ask_passphrase", is_flag=True,
              help=f"Encrypt under a passphrase (the default): from {PASSPHRASE_ENV}, else asked for.")
@click.option("--plaintext", is_flag=True, help="Write it unencrypted; the audit record says so.")
def models_export(ref: str, fmt: str, out: Path, recipient: str | None, ask_passphrase: bool, plaintext: bool) -> None:
    """Write a version (MODEL, MODEL:VERSION or MODEL@ALIAS) as a signed archive in an open format; admin only.

    The archive holds the model, its tokenizer, a model card and a manifest of every file's SHA-256 signed by
    this appliance; 'appliance models verify' checks it anywhere. It is encrypted with age unless --plaintext.
    """
    if sum((recipient is not None, ask_passphrase, plaintext)) > 1:
        raise click.UsageError("give one of --recipient, --passphrase and --plaintext")
    if out.exists():
        raise click.BadParameter(f"{out} exists: an archive is never written over a file", param_hint="--out")
    if not out.parent.is_dir():
        raise click.BadParameter(f"the folder {out.parent} does not exist", param_hint="--out")
    from appliance.registry import exchange  # pyrage and the archive code load for this command only

    protection = "recipient" if recipient else "plaintext" if plaintext else "passphrase"
    # A wrong key or a short passphrase is refused before anything is exported.
    passphrase = exchange.checked_passphrase(_new_passphrase()) if protection == "passphrase" else None
    if recipient is not None:
        exchange.age_recipient(recipient)
    spec = ExportJob.parse({"version": ref, "format": fmt, "protection": protection})
    with connected() as appliance:
        packed = appliance.export(spec)
    data = exchange.save(out, packed, recipient=recipient, passphrase=passphrase)
    click.echo(f"wrote {out} ({len(data) / 2**20:.1f} MiB, {protection}): archive SHA-256 "
               f"{hashlib.sha256(packed).hexdigest()}, as the audit log records it")


@models_group.command("verify")
@click.argument("archive_file", metavar="ARCHIVE", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--public-key", help="The key it must be signed by (hex, or its SHA-256), received separately.")
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An audit checkpoint exported earlier: the archive must be signed by the same key and store.")
@click.option("--identity", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The age identity file an encrypted archive was exported to.")
@json_option
def models_verify(archive_file: Path, public_key: str | None, checkpoint: Path | None, identity: Path | None,
                  as_json: bool) -> None:
    """Check an export archive offline: its signature and every file in it; exit 1 naming what fails.

    An encrypted one is opened with --identity, or with the passphrase (from APPLIANCE_EXPORT_PASSPHRASE, else
    asked for). Needs no store and no daemon.
    """
    from appliance.registry import exchange
    from appliance.store import anchor

    if checkpoint is not None:
        check_is_checkpoint(checkpoint)
    data = exchange.read_archive(archive_file, load_settings().daemon.max_upload_mb)
    verified = exchange.verify(data, **_opening(data, identity), public_key=public_key, checkpoint=checkpoint)
    card, checked = verified.card, verified.checked
    if as_json:
        print_json({"ok": True, "sha256": verified.sha256, "encrypted": verified.encrypted, "files": checked.files,
                    "public_key": checked.public_key, "trusted_by": checked.trusted, "card": card})
        return
    click.echo(f"archive OK: {card['model']} ({card['task']}, {card['format']}, variant {card['variant']}),"
               f" {len(checked.files)} files unchanged since store {checked.manifest.get('store_id', '?')} signed"
               f" them ({card['exported_at']})")
    click.echo(f"archive SHA-256 {verified.sha256}; signing key SHA-256 {anchor.fingerprint(checked.public_key)}")
    say_trust(checked.trusted, "archive")


@models_group.command("import")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--name", required=True, help="The model's name; the import becomes its next version.")
@click.option("--dataset", required=True,
              help="The dataset (NAME or NAME:VERSION) to measure it on; its labels must be among the model's, and "
                   "its task is the model's.")
@click.option("--task", type=click.Choice(["text-classification", "image-classification"]),
              help="What the model does (checked against the dataset's task, which decides when it is left out).")
@click.option("--labels", help="The model's labels in logit order, comma-separated, where its config.json does not "
                               "name them.")
@click.option("--public-key", help="An export archive must be signed by this key (hex, or its SHA-256).")
@click.option("--identity", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The age identity file an encrypted export archive was exported to.")
def models_import(path: Path, name: str, dataset: str, task: str | None, labels: str | None, public_key: str | None,
                  identity: Path | None) -> None:
    """Import a model trained elsewhere as a new version of NAME.

    PATH is a Hugging Face folder (config.json and model.safetensors; pickled weights are refused), a folder with an
    ONNX graph or an OpenVINO IR beside config.json and the tokenizer's files (an image classifier's: beside
    config.json and preprocessor_config.json), or an appliance's export archive
    (its signature must verify; an encrypted one is opened here with --identity or its passphrase). The model is
    checked, measured on the dataset's validation split and stored encrypted; its FP32 OpenVINO IR serves, and
    'appliance optimize' quantises it under the accuracy guard like a trained model.
    """
    from appliance.registry import exchange

    content = None
    if exchange.is_encrypted(path):  # only this user can open it: the daemon gets the archive inside
        data = exchange.read_archive(path, load_settings().daemon.max_upload_mb)
        content = exchange.decrypt(data, **_opening(data, identity))
    options: dict[str, Any] = {"name": name, "dataset": dataset,
                               "labels": [label.strip() for label in labels.split(",")] if labels else []}
    if public_key:
        options["public_key"] = public_key
    if task:
        options["task"] = task
    with connected() as appliance:
        version = appliance.import_model(path, content, options)
    imported = version["lineage"]["trained_on"]
    click.echo(f"imported as {version['model']}:{version['version']} ({imported})")
    click.echo(f"{version['reason']}")
    click.echo(f"next: 'appliance deploy {version['model']}:{version['version']}' serves it as it is; 'appliance "
               f"optimize {version['model']}:{version['version']}' makes a faster version first")


def _opening(data: bytes, identity: Path | None) -> dict[str, str | None]:
    """What opens an archive if it is encrypted: the identity file given, else the passphrase (from the
    environment, else asked for)."""
    from appliance.registry import exchange

    if not data.startswith(exchange.AGE_MAGIC):
        return {"identity": None, "passphrase": None}
    if identity is not None:
        text = files.read_file(identity, "the age identity file", files.MAX_SMALL_FILE, error=RegistryError,
                               over="give the file age-keygen wrote").decode(errors="replace")
        return {"identity": text, "passphrase": None}
    return {"identity": None, "passphrase": passphrase_from(PASSPHRASE_ENV, "Passphrase")}


def _new_passphrase() -> str:
    return passphrase_from(PASSPHRASE_ENV, "Passphrase for the archive", confirm=True)


def show_version(version: dict[str, Any]) -> None:
    """A version for a person: aliases, the guard's decision, lineage, then its variants side by side."""
    lineage = version["lineage"]
    click.echo(f"{version['model']}:{version['version']}  ({', '.join(version['aliases']) or 'not deployed'})"
               f"  {version['task']}")
    click.echo(f"chosen: {version['chosen']} - {version['reason']}")
    click.echo(f"lineage: run {lineage['run']}, dataset {lineage['dataset'][:12]}, base {lineage['base_model']},"
               f" trained on {lineage['trained_on']}")
    click.echo("hyperparameters: " + ", ".join(f"{key}={value}" for key, value in lineage["params"].items()))
    named = max(16, *(len(name) + 1 for name in version["variants"]))  # student-int8-gentle is 19 characters
    click.echo(f"{'variant':<{named}}{'format':<13}{'MiB':>6}{'acc':>7}{'F1':>7}{'p50 ms':>8}{'b1/s':>7}{'b16/s':>7}"
               f"{'x fp32':>7}")
    for variant in sorted(version["variants"].values(),
                          key=lambda v: (v["name"] != "torch", "student" in v["name"], v["name"])):
        cells = "".join(_cell(variant["metrics"].get(name), spec) for name, spec in COLUMNS)
        click.echo(f"{variant['name']:<{named}}{variant['format']:<13}{variant['bytes'] / 2**20:>6.1f}{cells}")


COLUMNS = (("accuracy", ">7.3f"), ("macro_f1", ">7.3f"), ("latency_ms_p50", ">8.1f"), ("throughput_b1", ">7.0f"),
           ("throughput_b16", ">7.0f"), ("speedup_b16", ">7.2f"))


def _cell(value: float | None, spec: str) -> str:
    width = spec[1:].split(".")[0]
    return f"{'-':>{width}}" if value is None else f"{value:{spec}}"
