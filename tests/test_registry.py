"""The registry: immutable versions, lineage, aliases that deploy moves and rollback undoes."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from appliance import registry
from appliance.core.errors import RegistryError
from appliance.data import datasets
from appliance.store import Store, audit, blobs
from appliance.train import runs
from tests.conftest import run_cli


@pytest.fixture
def run_id(opened: Store, tmp_path: Path) -> str:
    csv = tmp_path / "d.csv"
    csv.write_text("text,label\n" + "".join(f"text {n},{'ab'[n % 2]}\n" for n in range(20)))
    version = datasets.import_file(opened, csv, name="d")
    return runs.create(opened, dataset_id=version.id, base_model="/models/minilm", task=version.task,
                       params={"epochs": 3}, plan={"device": "cpu"})


def _register(opened: Store, run_id: str, accuracy: float = 0.9) -> registry.ModelVersion:
    fp32 = blobs.put(opened, f"fp32 {accuracy}".encode())
    int8 = blobs.put(opened, f"int8 {accuracy}".encode())
    return registry.register(
        opened,
        "tickets",
        run_id=run_id,
        task="text-classification",
        variants=[
            registry.Variant("fp32", "openvino-ir", fp32, 90 << 20, {"accuracy": accuracy, "latency_ms_p50": 4.0}),
            registry.Variant("int8", "openvino-ir", int8, 23 << 20, {"accuracy": accuracy - 0.005, "latency_ms_p50": 1.5}),
        ],
        chosen="int8",
        reason="int8 within the 1.0 pt guard",
    )


def test_a_registered_version_carries_variants_and_lineage_and_serves_nothing(opened: Store, run_id: str) -> None:
    version = _register(opened, run_id)
    assert version.ref == "tickets:1" and version.aliases == ()
    assert version.variants["int8"].metrics["latency_ms_p50"] == 1.5
    lineage = version.lineage(opened)
    assert lineage["base_model"] == "/models/minilm" and lineage["params"] == {"epochs": 3}
    assert audit.rows(opened, action="model.register")[-1]["object"] == "tickets"


def test_a_model_name_holds_one_task_since_its_clients_send_what_its_versions_take(opened: Store,
                                                                                     run_id: str) -> None:
    version = _register(opened, run_id)
    photos = registry.Variant("fp32", "openvino-ir", blobs.put(opened, b"an image IR"), 10, {"accuracy": 0.9})
    with pytest.raises(RegistryError, match="tickets holds text-classification versions, and this one is for image"):
        registry.register(opened, "tickets", run_id=run_id, task="image-classification", variants=[photos],
                          chosen="fp32", reason="trained")
    assert [v.ref for v in registry.list_versions(opened)] == [version.ref]
    assert registry.register(opened, "photos", run_id=run_id, task="image-classification", variants=[photos],
                             chosen="fp32", reason="trained").ref == "photos:1"


def test_versions_are_immutable(opened: Store, run_id: str) -> None:
    _register(opened, run_id)
    with pytest.raises(sqlite3.DatabaseError, match="immutable"):
        opened.db.execute("UPDATE model_versions SET chosen = 'fp32'")
    with pytest.raises(sqlite3.DatabaseError, match="immutable"):
        opened.db.execute("UPDATE model_artifacts SET blob_id = 'x'")


def test_deploy_moves_production_and_rollback_walks_back(opened: Store, run_id: str) -> None:
    for n in range(3):
        _register(opened, run_id, accuracy=0.8 + n / 100)
    assert registry.get(opened, "tickets").version == 3  # no production yet: the newest
    assert registry.set_alias(opened, "tickets", "production", 1) is None
    assert registry.set_alias(opened, "tickets", "production", 2) == 1
    assert registry.set_alias(opened, "tickets", "production", 3) == 2
    assert registry.get(opened, "tickets@production").version == 3
    assert registry.rollback(opened, "tickets") == 2
    assert registry.rollback(opened, "tickets") == 1
    assert registry.get(opened, "tickets").version == 1
    with pytest.raises(RegistryError, match="no earlier version"):
        registry.rollback(opened, "tickets")
    with pytest.raises(RegistryError, match="no model named 'tickest'"):  # not "has no earlier version"
        registry.rollback(opened, "tickest")
    outcomes = [(r["action"], r["outcome"]) for r in audit.rows(opened, action="model.rollback")]
    assert outcomes == [("model.rollback", "ok")] * 2 + [("model.rollback", "failed")] * 2


def test_unknown_models_versions_and_aliases_are_named(opened: Store, run_id: str) -> None:
    _register(opened, run_id)
    with pytest.raises(RegistryError, match="no model named 'nope'"):
        registry.get(opened, "nope")
    with pytest.raises(RegistryError, match="has no version 7"):
        registry.get(opened, "tickets:7")
    with pytest.raises(RegistryError, match="unknown alias 'live'"):
        registry.set_alias(opened, "tickets", "live", 1)
    with pytest.raises(RegistryError, match="has no version 9"):
        registry.set_alias(opened, "tickets", "production", 9)


def test_cli_lists_and_shows_versions(opened: Store, run_id: str) -> None:
    _register(opened, run_id)
    registry.register(opened, "raw", run_id=run_id, task="text-classification", chosen="torch", reason="trained",
                      variants=[registry.Variant("torch", "torch-bundle", blobs.put(opened, b"bundle"), 6, {})])
    opened.close()
    listed = run_cli("models", "list", check=True).stdout
    assert re.search(r"^tickets:1 .* serves int8 ", listed, re.MULTILINE)
    assert re.search(r"^raw:1 .* not optimised ", listed, re.MULTILINE)  # a torch bundle only: it cannot serve
    shown = run_cli("models", "show", "tickets:1", check=True).stdout
    assert "chosen: int8 - int8 within the 1.0 pt guard" in shown and "p50 ms" in shown
    assert re.search(r"^int8 +openvino-ir +23\.0 +0\.895 +- +1\.5 ", shown, re.MULTILINE), shown
    as_json = json.loads(run_cli("models", "show", "tickets:1", "--json", check=True).stdout)
    assert as_json["lineage"]["base_model"] == "/models/minilm"
    missing = run_cli("models", "show", "nope")
    assert missing.returncode == 1 and "no model named 'nope'" in missing.stderr


def test_deploy_moves_production_and_a_canary_splits_traffic_until_stopped(opened: Store, run_id: str) -> None:
    _register(opened, run_id)
    _register(opened, run_id, accuracy=0.92)
    with pytest.raises(RegistryError, match="nothing serves in production yet") as raised:
        registry.deploy(opened, "tickets:2", canary_percent=10)
    assert "appliance deploy tickets:VERSION" in raised.value.hint
    assert registry.deploy(opened, "tickets:1").aliases == ("production",)
    with pytest.raises(RegistryError, match="it already serves in production"):
        registry.deploy(opened, "tickets:1", canary_percent=10)
    with pytest.raises(RegistryError, match="above 0 and at most 100"):
        registry.deploy(opened, "tickets:2", canary_percent=150)

    canary = registry.deploy(opened, "tickets", canary_percent=25)  # a bare name is the newest version
    assert canary.ref == "tickets:2" and canary.aliases == ("candidate",)
    assert registry.canary_percent(opened, "tickets") == 25
    _register(opened, run_id)  # a new version while the canary runs: it takes none of the canary's traffic
    assert registry.deployments(opened)["tickets"].candidate == 2
    registry.stop_canary(opened, "tickets")
    assert registry.canary_percent(opened, "tickets") == 0 and registry.get(opened, "tickets@production").version == 1
    assert registry.get(opened, "tickets:2").aliases == ()  # no traffic, no candidate label
    registry.deploy(opened, "tickets:2", canary_percent=25)
    registry.deploy(opened, "tickets:2")  # promotion ends the canary
    assert registry.canary_percent(opened, "tickets") == 0 and registry.get(opened, "tickets@production").version == 2
    assert registry.get(opened, "tickets:2").aliases == ("production",)
    actions = [row["action"] for row in audit.rows(opened, action="model.*")]
    assert actions.count("model.canary") == 2 and "model.canary_stop" in actions and "model.deploy" in actions


def test_a_version_that_is_not_optimised_cannot_be_deployed(opened: Store, run_id: str) -> None:
    bundle = blobs.put(opened, b"a torch bundle")
    registry.register(opened, "raw", run_id=run_id, task="text-classification", chosen="torch", reason="trained",
                      variants=[registry.Variant("torch", "torch-bundle", bundle, 14, {"accuracy": 0.9})])
    with pytest.raises(RegistryError, match="raw:1 is not optimised") as raised:
        registry.deploy(opened, "raw:1")
    assert raised.value.hint == "'appliance optimize raw:1' makes a version that can serve"
    assert registry.get(opened, "raw:1").aliases == ()


def test_a_version_that_never_served_is_deleted_with_its_weights_and_its_number_is_not_given_again(
        opened: Store, run_id: str) -> None:
    _register(opened, run_id, 0.8)
    second = _register(opened, run_id, 0.9)
    runs.finish(opened, run_id, blobs.put(opened, b"trained weights"), {"accuracy": 0.9})
    registry.deploy(opened, "tickets:1")

    deleted = registry.delete(opened, "tickets:2", actor="user:admin")
    assert deleted.ref == "tickets:2" and not any(blobs.exists(opened, v.blob_id) for v in second.variants.values())
    assert runs.get(opened, run_id).model_blob is not None  # tickets:1 still comes from that run
    with pytest.raises(RegistryError, match=r"tickets:2 was deleted on .* by user:admin"):
        registry.get(opened, "tickets:2")
    assert [v.ref for v in registry.list_versions(opened)] == ["tickets:1"]
    assert _register(opened, run_id).ref == "tickets:3"
    record = audit.rows(opened, action="model.delete")[-1]
    assert (record["object"], record["actor"], record["outcome"]) == ("tickets:2", "user:admin", "ok")


def test_a_version_that_serves_or_that_a_rollback_could_return_to_is_not_deleted(opened: Store, run_id: str) -> None:
    for accuracy in (0.8, 0.85, 0.9):
        _register(opened, run_id, accuracy)
    registry.deploy(opened, "tickets:1")
    registry.deploy(opened, "tickets:2")
    registry.deploy(opened, "tickets:3", canary_percent=10)
    for ref, reason in (("tickets:2", "is the production version"), ("tickets:3", "is the candidate version"),
                        ("tickets:1", "a rollback of tickets@production could return to it")):
        with pytest.raises(RegistryError, match=reason):
            registry.delete(opened, ref)
    assert len(registry.list_versions(opened)) == 3
    assert [r["outcome"] for r in audit.rows(opened, action="model.delete")] == ["failed"] * 3


def test_the_last_version_of_a_run_takes_the_runs_weights_with_it(opened: Store, run_id: str) -> None:
    weights = blobs.put(opened, b"trained weights")
    runs.finish(opened, run_id, weights, {"accuracy": 0.9})
    _register(opened, run_id)
    registry.delete(opened, "tickets:1")
    assert runs.get(opened, run_id).model_blob is None and not blobs.exists(opened, weights)
    assert runs.get(opened, run_id).status == "finished"  # the run and its curve stay


@pytest.mark.parametrize("version", ["9" * 19, "-1", "\u00b2"])
def test_a_version_that_is_no_version_number_says_what_one_is(opened: Store, version: str) -> None:
    with pytest.raises(RegistryError, match=r"the version must be a version number \(digits, at most 18\)"):
        registry.get(opened, f"tickets:{version}")
