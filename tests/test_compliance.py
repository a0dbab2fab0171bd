"""The compliance evidence pack: it lists exactly what the store holds and did, and any edit fails its check."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from appliance import registry
from appliance.access import auth, users
from appliance.compliance import evidence, pack
from appliance.core import config
from appliance.core.errors import EvidenceError
from appliance.data import datasets
from appliance.operations import burst
from appliance.store import Store, anchor, audit, lifecycle
from appliance.train.params import TrainParams
from tests.conftest import model_trained_on, run_cli, write_tickets


class UnreachableCluster:
    """A cluster that accepts a submission and runs nothing: the burst's own send path and audit record, no Ray.

    A real burst (tests/test_burst.py, against a Ray head on loopback, where the report is checked too) trains for
    a minute; what the report reads of it is the burst.send record, which burst.submit writes here as it does there.
    """

    address = "http://ray-central.example:8265"

    def submit(self, submission_id: str, packages: list[Path], key: bytes) -> None:
        assert packages and len(key) == 32  # the sealed payloads and their key were handed over

    def where(self, submission_id: str) -> str:
        return f"ray://ray-central.example:8265/{submission_id}"


class Silent:
    def submitted(self, submission: dict[str, str]) -> None: ...
    def log(self, line: str) -> None: ...


def _report(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


def test_the_report_lists_exactly_what_exists(opened: Store, tmp_path: Path) -> None:
    allowed = datasets.import_file(opened, write_tickets(tmp_path / "a.csv", per_class=5), name="tickets",
                                   residency=datasets.BURST_ALLOWED)
    local = datasets.import_file(opened, write_tickets(tmp_path / "b.csv", per_class=5, seed=2), name="contracts")
    model = model_trained_on(opened, allowed, "support")
    registry.set_alias(opened, "support", "production", model.version)
    user, _ = users.add(opened, "auditor", "viewer")
    key, _ = auth.create(opened, "crm", ["support"])
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    submission = burst.submit(opened, UnreachableCluster(), burst.Request("tickets", base, TrainParams(), None,
                                                                          "job1", "user:alice"), Silent())
    lifecycle.rotate(opened)

    written = pack.write(opened, tmp_path / "pack")
    facts = _report(written.folder)

    assert sorted(written.files) == ["README.txt", "report.html", "report.json"]  # no PDF converter here
    assert "report.pdf skipped" in written.pdf or "report.pdf made" in written.pdf
    assert [(d["ref"], d["residency"], d["examples"], d["id"]) for d in facts["datasets"]] == [
        ("contracts:1", "local-only", local.examples, local.id), ("tickets:1", "burst-allowed", allowed.examples,
                                                                 allowed.id)]
    used = facts["datasets"][1]["used_by"]
    assert used["models"] == ["support:1"] and used["bursts"] == [submission["id"]] and len(used["runs"]) == 1
    assert facts["datasets"][0]["used_by"] == {"runs": [], "studies": [], "models": [], "bursts": []}
    # Lineage: dataset -> run -> version -> variants, and the alias moves that deployed it.
    run = facts["lineage"]["runs"][0]
    assert run["dataset"] == "tickets:1" and run["trained_on"] == "this appliance" and run["params"] == {"epochs": 1}
    assert run["model_versions"][0]["ref"] == "support:1" and run["model_versions"][0]["aliases"] == ["production"]
    assert [(m["alias"], m["version"]) for m in facts["lineage"]["alias_moves"]] == [("production", 1)]
    # The burst is a transfer: what left, to where, by whom.
    (transfer,) = facts["transfers"]
    assert transfer["submission"] == submission["id"] and transfer["to"] == UnreachableCluster.address
    assert (transfer["dataset"], transfer["dataset_id"], transfer["actor"]) == ("tickets:1", allowed.id, "user:alice")
    assert transfer["sealed_bytes"] > transfer["dataset_bytes"] > 0 and transfer["last_step"] == "burst.submit ok"
    # Keys: creation and rotation, the key in force; access; the audit chain and its signed head.
    assert [r["action"] for r in facts["keys"]["history"]] == ["keys.init", "keys.rotate"]
    assert facts["keys"]["in_force"]["fingerprint"] == opened.master.fingerprint
    assert [(u["name"], u["role"], u["id"]) for u in facts["access"]["users"]] == [("auditor", "viewer", user.id)]
    assert [(k["name"], k["models"]) for k in facts["access"]["api_keys"]] == [("crm", ["support"])]
    assert key.id in json.dumps(facts["access"])
    assert facts["audit"]["verification"]["ok"] and facts["audit"]["public_key"] == anchor.public_key(opened)
    head = anchor.Head(**facts["audit"]["signed_head"])
    assert head.is_signed_by(anchor.public_key(opened)) and head.seq == facts["audit"]["verification"]["records"]
    assert all(f["ok"] for f in facts["encryption"]["files"])
    assert facts["encryption"]["blobs"]["cipher"] == "AES-256-GCM"

    # The HTML says the same, escaped and self-contained; the report itself is on the audit record.
    page = (written.folder / "report.html").read_text()
    assert "tickets:1" in page and "burst-allowed" in page and submission["id"] in page and "ray-central" in page
    assert "<script" not in page and "http://" not in page.replace(UnreachableCluster.address, "")
    (record,) = audit.rows(opened, action=pack.ACTION)
    assert json.loads(record["details"])["audit_head"] == head.seq and record["object"] == str(written.folder)
    assert audit.verify(opened).ok


def test_verify_passes_an_untouched_pack_and_names_a_changed_file(tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    run_cli("data", "import", str(write_tickets(tmp_path / "t.csv", per_class=5)), "--name", "tickets", check=True)
    run_cli("audit", "checkpoint", "-o", "checkpoint.json", check=True)
    made = run_cli("compliance", "report", "--out", "pack", check=True)
    assert "report.pdf skipped" in made.stdout or "report.pdf made" in made.stdout

    # Offline and without the store: the state directory may be gone.
    shutil.copytree("pack", "copy")
    shutil.rmtree(tmp_path / "var", ignore_errors=True)
    ok = run_cli("compliance", "verify", "copy", check=True)
    assert "pack OK" in ok.stdout and "proves the pack is intact, not who made it" in ok.stdout
    vouched = run_cli("compliance", "verify", "copy", "--checkpoint", "checkpoint.json", check=True)
    assert "vouched for by the audit checkpoint" in vouched.stdout

    for name in ("report.html", "report.json"):
        edited = tmp_path / f"edited-{name}"
        shutil.copytree("pack", edited)
        data = bytearray((edited / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (edited / name).write_bytes(bytes(data))
        failed = run_cli("compliance", "verify", str(edited))
        assert failed.returncode == 1 and f"{name}: changed after the pack was signed" in failed.stderr
        assert "Traceback" not in failed.stderr


def test_a_forged_manifest_an_added_file_or_another_key_fail(opened: Store, tmp_path: Path) -> None:
    written = pack.write(opened, tmp_path / "pack")
    assert pack.verify(written.folder, public_key=written.public_key).trusted == "the public key given"

    manifest = written.folder / pack.MANIFEST
    original = manifest.read_bytes()
    manifest.write_bytes(original.replace(b'"bytes": ', b'"bytes": 1', 1))
    with pytest.raises(EvidenceError, match="manifest.json does not match manifest.sig"):
        pack.verify(written.folder)
    manifest.write_bytes(original)

    (written.folder / "extra.html").write_text("<p>all fine</p>")
    with pytest.raises(EvidenceError, match="extra.html: not covered by the signature"):
        pack.verify(written.folder)
    (written.folder / "extra.html").unlink()

    huge = written.folder / "report.html"  # a folder given to verify may hold a file of any size: never read whole
    page = huge.read_bytes()
    os.truncate(huge, 3 * 2**30)  # sparse: nothing is written
    with pytest.raises(EvidenceError, match=f"the pack's file {huge} holds 3,221,225,472 bytes, over its limit"):
        pack.verify(written.folder)
    huge.write_bytes(page)

    other = "11" * 32
    with pytest.raises(EvidenceError, match="not the key given"):
        pack.verify(written.folder, public_key=other)
    with pytest.raises(EvidenceError, match="exists and is not an empty folder"):
        pack.write(opened, written.folder)


def test_a_passphrase_store_reports_its_scrypt_cost_and_no_key_file(settings: config.Settings) -> None:
    with lifecycle.init(settings, "correct horse battery staple") as opened:
        facts = evidence.collect(opened)
    assert facts["encryption"]["master_key"]["kdf"] == {"algorithm": "scrypt", "n": 2**15, "r": 8, "p": 1}
    assert facts["keys"]["in_force"]["source"] == "passphrase" and "salt" not in json.dumps(facts)
    assert str(settings.key_file) not in [f["path"] for f in facts["encryption"]["files"]]
