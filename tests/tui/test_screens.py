"""Every screen driven with Textual's Pilot against a real daemon on a temporary state directory."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Log, RichLog, Select
from textual.widgets._data_table import default_cell_formatter  # how a DataTable renders a cell

from appliance import registry, store
from appliance.access import users
from appliance.data import datasets
from appliance.store import alerts, blobs
from appliance.train import runs
from tests.conftest import Trained
from tests.daemon import TINY, Daemon, environment, settings_of, submit
from tests.serve.test_images_served import deploy_shapes
from tests.test_imports import hf_folder
from tests.train.test_images import write_shapes
from tests.tui.conftest import RECORDED_STUDY, SIZE, RecordedDaemon, settle, text
from tui.app import ApplianceApp
from tui.widgets import Connection, Table

pytestmark = pytest.mark.slow


def rows(app: ApplianceApp, selector: str) -> dict[str, list[str]]:
    """A table's rows by key, as the operator reads them: each cell as the table renders it."""
    table = app.screen.query_one(selector, Table)
    return {key.value: [default_cell_formatter(cell).plain for cell in table.get_row(key)] for key in table.rows}


def notices(app: ApplianceApp) -> str:
    return "\n".join(notification.message for notification in app._notifications)


def api(daemon: Daemon, path: str) -> Any:
    with daemon.api() as http:
        return http.get(path).json()


async def open_on_models(pilot: Any, app: ApplianceApp, ref: str) -> None:
    """The Models screen, its cursor on version ref once the list shows it."""
    await pilot.press("4")
    await settle(pilot, lambda: ref in rows(app, "#models"))
    app.screen.query_one("#models", Table).select(ref)


async def test_the_overview_shows_the_box_its_load_and_what_it_serves(served: Daemon) -> None:
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda: "Plan for" in text(app, "#hardware"), message="no hardware panel")
        assert "RAM" in text(app, "#hardware") and "OpenVINO  CPU" in text(app, "#hardware")
        await settle(pilot, lambda: "serving READY" in text(app, "#service"), message="serving never ready")
        assert "CPU  [" in text(app, "#service")
        production = api(served, "/v1/serving")["models"][0]["versions"][0]["version"]
        await settle(pilot, lambda: f"tickets: v{production} " in text(app, "#served"), message="no served model")
        assert "1 finished" in text(app, "#service")
        assert app.connection is Connection.CONNECTED


async def test_an_import_lists_the_problems_by_line_and_a_clean_file_is_stored(served: Daemon,
                                                                             tmp_path: Path) -> None:
    source = tmp_path / "faq.csv"
    source.write_text("text,label\nhow do I reset my password,account\n,billing\nwhere is my invoice,billing\n")
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2", "i")
        dialog = app.screen
        os.mkfifo(tmp_path / "pipe.csv")  # was read without end, the dialog waiting for good
        dialog.query_one("#path").value = str(tmp_path / "pipe.csv")
        dialog.query_one("#name").value = "faq"
        await click_submit(pilot)
        await settle(pilot, lambda: "pipe.csv is a named pipe (FIFO), not a regular file" in text(app, "#problem"),
                     message="the pipe was not refused")
        dialog.query_one("#path").value = str(source)
        await click_submit(pilot)
        problem = await settle(pilot, lambda: "line 3" in (shown := text(app, "#problem")) and shown,
                               message="the import problems were not shown")
        assert "empty text" in problem
        assert app.screen is dialog  # the dialog stays open with what was typed

        source.write_text("text,label\n" + "".join(f"question {i},{'account' if i % 2 else 'billing'}\n"
                                                   for i in range(20)))
        await click_submit(pilot)
        await settle(pilot, lambda: app.screen is not dialog, message="the clean import kept the dialog open")
        await settle(pilot, lambda: "faq:1" in rows(app, "#datasets"), message="the clean import is not listed")
        assert rows(app, "#datasets")["faq:1"][2] == "20"
    assert any(version["ref"] == "faq:1" for version in api(served, "/v1/datasets"))


async def open_wizard(pilot: Any) -> Any:
    """The fine-tune wizard on the tickets, with the tiny model's quick settings as its advanced options."""
    await pilot.press("3", "n")
    dialog = pilot.app.screen
    await settle(pilot, lambda: isinstance(dialog.query_one("#dataset").value, str), message="no datasets offered")
    dialog.query_one("#dataset").value = "tickets:1"
    for name, value in (("epochs", "2"), ("learning_rate", "0.003"), ("batch_size", "16"), ("max_length", "32")):
        dialog.query_one(f"#{name}").value = value
    return dialog


async def click_submit(pilot: Any) -> None:
    """Click the dialog's submit button once it takes a click: for 0.2 s after a press a Textual button ignores
    clicks (its '-active' effect), and a test types and clicks again faster than that."""
    await settle(pilot, lambda: not pilot.app.screen.query_one("#submit").has_class("-active"),
                 message="the submit button stayed pressed")
    await pilot.click("#submit")


async def refused(pilot: Any, dialog: Any, field: str, value: str, problem: str, then: str) -> None:
    """A bad value in a field: the wizard says what is wrong and stays open; `then` is typed in its place."""
    dialog.query_one(field).value = value
    await click_submit(pilot)
    await settle(pilot, lambda: problem in text(pilot.app, "#problem"), message=f"no problem shown for {field}")
    assert pilot.app.screen is dialog
    dialog.query_one(field).value = then


async def submitted(pilot: Any, dialog: Any, daemon: Daemon) -> str:
    """Submit the wizard; the id of the job it queued, once the Jobs screen lists it."""
    before = {job["id"] for job in api(daemon, "/v1/jobs")}
    await click_submit(pilot)
    await settle(pilot, lambda: pilot.app.screen is not dialog, message="the wizard did not submit")
    return await settle(pilot, lambda: next(iter(set(rows(pilot.app, "#jobs")) - before), None))


async def test_the_wizard_starts_a_fine_tune_and_the_job_shows_progress_charts_and_log(served: Daemon) -> None:
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await open_wizard(pilot)
        await refused(pilot, dialog, "#priority", "high", "priority must be a whole number", then="5")
        await refused(pilot, dialog, "#workers", "two", "workers must be a number", then="")
        await refused(pilot, dialog, "#checkpoint_minutes", "0", "checkpoint_minutes", then="5")
        dialog.query_one("#distill").value = True  # a student is part of the optimisation "train only" skips
        await refused(pilot, dialog, "#deploy", "", "a student is distilled when the new model is optimised",
                      then="auto")
        dialog.query_one("#distill").value = False
        job_id = await submitted(pilot, dialog, served)
        assert app.screen.query_one("#jobs", Table).selected == job_id  # the newest, at the top
        job = api(served, f"/v1/jobs/{job_id}")
        assert job["kind"] == "pipeline" and job["priority"] == 5 and job["params"]["deploy"] == "auto"
        assert job["params"]["params"] == {"epochs": 2, "learning_rate": 0.003, "batch_size": 16, "max_length": 32,
                                           "checkpoint_minutes": 5}

        await settle(pilot, lambda: rows(app, "#jobs")[job_id][2] == "finished", seconds=300,
                     message="the job did not finish on screen")
        await settle(pilot, lambda: text(app, "#job-step") == "finished")
        loss = app.screen.query_one("#loss-chart .chart-value")
        assert float(str(loss.render())) > 0
        assert str(app.screen.query_one("#accuracy-chart .chart-value").render()).endswith("%")

        def ended_log() -> list[str] | None:  # the job's own end comes before its process's last lines are drained
            lines = api(served, f"/v1/jobs/{job_id}/logs")  # what `appliance jobs logs` prints: each line once
            return lines if lines[-1:] == ["finished"] else None

        logged = await settle(pilot, ended_log, message="the job's log did not reach its end")
        await settle(pilot, lambda: list(app.screen.query_one("#job-log", Log).lines) == logged,
                     message="the log pane is not the job's log")
        assert "stage: deploy" in logged  # to the last line
        assert f"job {job_id} finished" in notices(app)


async def test_the_wizard_starts_a_search_and_its_trials_are_ranked_with_their_curves(served: Daemon) -> None:
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await open_wizard(pilot)
        await refused(pilot, dialog, "#budget", "-1", "the search budget is a number of minutes above 0", then="1")
        dialog.query_one("#deploy").value = "never"
        job_id = await submitted(pilot, dialog, served)
        job = api(served, f"/v1/jobs/{job_id}")
        assert job["kind"] == "tune" and job["params"]["budget_s"] == 60 and job["params"]["deploy"] == "never"

        await settle(pilot, lambda: app.screen.query_one("#jobs", Table).selected == job_id)
        await pilot.press("s")
        search = app.screen
        await settle(pilot, lambda: sum(row[2] in ("complete", "pruned") for row in rows(app, "#trials").values()) >= 2,
                     seconds=180, message="no two trials ended on screen")
        ranked = list(rows(app, "#trials").values())
        assert [row[0] for row in ranked] == [str(rank) for rank in range(1, len(ranked) + 1)]
        complete = [float(row[3]) for row in ranked if row[2] == "complete"]
        assert complete == sorted(complete, reverse=True) and ranked[0][2] in ("complete", "running")
        assert ranked[0][5] != "-"  # the learning rate it tried
        await settle(pilot, lambda: text(app, "#trial-curve .chart-value") != "-", message="no learning curve")
        assert text(app, "#importances").startswith("importance:")
        await pilot.press("escape")
        assert app.screen is not search
    with served.api() as http:  # leave the daemon free for the next test
        http.post(f"/v1/jobs/{job_id}/cancel")
    assert served.ended(job_id)["status"] in ("cancelled", "finished")


async def test_l_shows_a_jobs_whole_log_with_times_wrapped_or_not(served: Daemon) -> None:
    pipeline = next(job for job in api(served, "/v1/jobs") if job["kind"] == "pipeline")
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        table = await settle(pilot, lambda: (table := app.screen.query_one("#jobs", Table)).row_count and table)
        table.select(pipeline["id"])
        await pilot.press("l")

        def shown() -> list[str]:
            return [strip.text.rstrip() for strip in app.screen.query_one(RichLog).lines]

        lines = await settle(pilot, lambda: "the whole log" in text(app, "#log-state") and shown())
        assert re.fullmatch(r"\d\d:\d\d:\d\d  finished", lines[-1]) and any("stage: train" in line for line in lines)
        assert [line[10:] for line in lines] == api(served, f"/v1/jobs/{pipeline['id']}/logs")  # each once, in order
        await pilot.press("w")
        assert "w: wrap on" in text(app, "#log-state")
        await pilot.press("escape")
        assert app.screen.query("#jobs")


async def test_cancelling_a_job_asks_first(served: Daemon) -> None:
    job_id = submit(served, "train", {"dataset": "tickets", "params": {**TINY, "epochs": 500}})
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await settle(pilot, lambda: app.screen.query_one("#jobs", Table).selected == job_id)
        await pilot.press("c")
        assert "Cancel job" in str(app.screen.query_one(".question").render())
        await pilot.press("n")
        assert api(served, f"/v1/jobs/{job_id}")["status"] in ("queued", "running")
        await pilot.press("c", "y")
        await settle(pilot, lambda: rows(app, "#jobs")[job_id][2] == "cancelled", seconds=120,
                     message="the job was not cancelled")


def optimised_versions(daemon: Daemon) -> list[int]:
    """The versions the server can load: those an optimisation registered (training registers torch alone)."""
    return [version["version"] for version in api(daemon, "/v1/models") if version["servable"]]


async def test_models_compare_variants_and_a_canary_is_started_and_rolled_back(served: Daemon) -> None:
    if len(optimised_versions(served)) < 2:
        served.ended(submit(served, "pipeline", {"dataset": "tickets", "params": TINY}))
    production = api(served, "/v1/serving")["models"][0]["versions"][0]["version"]
    older = f"tickets:{next(v for v in optimised_versions(served) if v != production)}"
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        table = await settle(pilot, lambda: (table := app.screen.query_one("#models", Table)).row_count >= 4 and table)
        table.select(f"tickets:{production}")
        variants = await settle(pilot, lambda: len(found := rows(app, "#variants")) > 1 and found)
        assert {"torch", "fp32", "int8"} <= set(variants) and variants["int8"][1] == "openvino-ir"
        assert all(row[3].endswith("%") for row in variants.values())  # accuracy side by side

        await pilot.press("k", "enter")
        await settle(pilot, lambda: "it already serves in production" in notices(app),
                     message="canary of the production version was not refused")

        table.select(older)
        await pilot.press("k")
        app.screen.query_one("#percent").value = "25"
        await pilot.press("enter")
        await settle(pilot, lambda: rows(app, "#models")[older][2] == "25%", message="no canary on screen")
        assert api(served, "/v1/serving")["models"][0]["canary_percent"] == 25

        await pilot.press("r")
        assert "Stop the canary of tickets" in str(app.screen.query_one(".question").render())
        await pilot.press("y")
        await settle(pilot, lambda: rows(app, "#models")[older][2] == "-", message="the canary did not stop")
        assert api(served, "/v1/serving")["models"][0]["canary_percent"] == 0


async def test_a_version_that_cannot_serve_is_optimised_from_the_models_screen(served: Daemon) -> None:
    trained = served.ended(submit(served, "train", {"dataset": "tickets", "params": TINY}))
    ref = trained["result"]["version"]
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await open_on_models(pilot, app, ref)
        assert rows(app, "#models")[ref][3] == "not optimised"
        await pilot.press("d")  # refused before any question, with what to do instead
        await settle(pilot, lambda: f"{ref} is not optimised, so it cannot serve: o optimises it" in notices(app))
        await pilot.press("o")
        assert f"Optimise {ref}?" in str(app.screen.query_one(".question").render())
        await pilot.press("y")
        await settle(pilot, lambda: "optimises it" in notices(app), message="no optimize job was started")
        job = next(job for job in api(served, "/v1/jobs") if job["kind"] == "optimize")
        assert job["params"]["version"] == ref
        optimised = served.ended(job["id"])["result"]["version"]  # versions never change: a new one can serve
        await settle(pilot, lambda: rows(app, "#models").get(optimised, [""] * 4)[3] in ("fp32", "int8", "student"),
                     seconds=10, message="the optimised version does not show what it serves")


async def test_a_student_sized_for_this_cpu_is_distilled_from_the_models_screen(served: Daemon) -> None:
    production = f"tickets:{api(served, '/v1/serving')['models'][0]['versions'][0]['version']}"
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await open_on_models(pilot, app, production)
        await pilot.press("s")
        assert f"Distil a student of {production}?" in str(app.screen.query_one(".question").render())
        await pilot.press("y")
        await settle(pilot, lambda: "distils a student of it" in notices(app), message="no distillation was started")
    job = next(job for job in api(served, "/v1/jobs") if job["params"].get("distill"))
    assert job["kind"] == "optimize" and job["params"]["version"] == production
    ref = served.ended(job["id"])["result"]["version"]
    version = next(version for version in api(served, "/v1/models") if f"{version['model']}:{version['version']}" == ref)
    assert "student-fp32" in version["variants"]
    assert version["reason"].startswith("1-layer") and "(shape: half the teacher's 2 layers" in version["reason"]


async def test_a_version_is_exported_from_the_models_screen_encrypted_to_a_recipient(
    served: Daemon, tmp_path: Path
) -> None:
    import pyrage

    from appliance.registry import exchange

    identity = pyrage.x25519.Identity.generate()
    production = f"tickets:{api(served, '/v1/serving')['models'][0]['versions'][0]['version']}"
    out = tmp_path / "tickets.tar.age"
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await open_on_models(pilot, app, production)
        await pilot.press("e")
        dialog = app.screen
        dialog.query_one("#format").value = "openvino"
        await refused(pilot, dialog, "#path", str(tmp_path), "give a new file", then=str(out))
        await click_submit(pilot)
        await settle(pilot, lambda: "give a recipient or a passphrase" in text(app, "#problem"))
        await refused(pilot, dialog, "#recipient", "age1nope", "is not an age X25519 recipient",
                      then=str(identity.to_public()))
        await click_submit(pilot)
        await settle(pilot, lambda: f"{production} written to {out}" in notices(app), seconds=120,
                     message="the export was not written")
    verified = exchange.verify(out.read_bytes(), identity=str(identity))
    assert verified.encrypted and verified.card["model"] == production and verified.card["format"] == "openvino"
    assert out.stat().st_mode & 0o777 == 0o600


async def test_a_model_trained_elsewhere_is_imported_from_the_models_screen(
    served: Daemon, trained: Trained, tmp_path: Path
) -> None:
    folder = hf_folder(trained, tmp_path / "vendor")
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4", "i")
        dialog = app.screen
        await settle(pilot, lambda: isinstance(dialog.query_one("#dataset").value, str), message="no datasets offered")
        dialog.query_one("#path").value = str(folder)
        await click_submit(pilot)
        await settle(pilot, lambda: "give it a name" in text(app, "#problem"))
        dialog.query_one("#name").value = "vendor"
        dialog.query_one("#dataset").value = "tickets:1"
        dialog.query_one("#labels").value = "a,a,b"
        await click_submit(pilot)
        await settle(pilot, lambda: "repeat or leave one empty" in text(app, "#problem"), seconds=60)
        assert app.screen is dialog
        dialog.query_one("#labels").value = ""
        await click_submit(pilot)
        await settle(pilot, lambda: app.screen is not dialog or "sending" not in text(app, "#problem"), seconds=120)
        assert app.screen is not dialog, text(app, "#problem")
        await settle(pilot, lambda: "vendor:1" in rows(app, "#models"), message="the imported model is not listed")
        assert "imported as vendor:1" in notices(app) and rows(app, "#models")["vendor:1"][3] == "fp32"


async def test_serving_shows_the_endpoints_and_tries_a_prediction(served: Daemon) -> None:
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await settle(pilot, lambda: "READY" in text(app, "#endpoints") and rows(app, "#served"))
        assert "/v1/models/tickets:predict" in text(app, "#endpoints")
        assert "gRPC" not in text(app, "#endpoints")  # serve.grpc_port is off unless set
        await pilot.press("t")
        await pilot.press(*"my invoice was charged twice", "enter")
        result = await settle(pilot, lambda: "[tickets:" in (shown := text(app, "#try-result")) and shown)
        tickets = next(version for version in api(served, "/v1/datasets") if version["ref"] == "tickets:1")
        assert result.split(" ", 1)[0] in tickets["labels"]
        await settle(pilot, lambda: any(row[5] not in ("-", "0.00") for row in rows(app, "#served").values()),
                     message="the prediction did not show in the request rate")
        await settle(pilot, lambda: any(row[1] == "user:local-admin" and row[3] != "0"
                                        for row in rows(app, "#usage").values()),
                     message="the prediction was not counted in the usage table")


async def test_an_image_model_is_tried_with_a_photos_path(tiny_base: Path, tmp_path: Path) -> None:
    env = environment(tmp_path / "var", tiny_base)
    settings = settings_of(env)
    folder = write_shapes(tmp_path / "shapes", per_class=4)
    deploy_shapes(settings, folder)
    daemon = Daemon(env, settings)
    daemon.start()
    try:
        app = ApplianceApp(settings=settings)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("5")
            await settle(pilot, lambda: "READY" in text(app, "#endpoints") and rows(app, "#served"), seconds=60)
            await pilot.press("t", *str(folder / "circle" / "1.jpg"), "enter")
            result = await settle(pilot, lambda: "[shapes:" in (shown := text(app, "#try-result")) and shown)
            assert result.split(" ", 1)[0] in ("circle", "square", "triangle")
            app.screen.query_one("#try-text", Input).value = str(tmp_path / "missing.jpg")
            await pilot.press("enter")
            await settle(pilot, lambda: "cannot read" in text(app, "#try-result"))
            assert "missing.jpg: No such file or directory" in text(app, "#try-result")
            os.mkfifo(tmp_path / "pipe.jpg")  # was opened on the event loop: the whole console froze
            app.screen.query_one("#try-text", Input).value = str(tmp_path / "pipe.jpg")
            await pilot.press("enter")
            await settle(pilot, lambda: "pipe.jpg is a named pipe (FIFO), not a regular file" in text(app, "#try-result"))

            await pilot.press("escape", "4")  # its export offers the formats an image model has
            await settle(pilot, lambda: "shapes:2" in rows(app, "#models"))
            app.screen.query_one("#models", Table).select("shapes:2")
            await pilot.press("e")
            formats = await settle(pilot, lambda: app.screen.query("#format") and app.screen.query_one("#format"))
            assert [value for _label, value in formats._options if value != Select.BLANK] == ["onnx", "openvino"]
    finally:
        daemon.stop(signal.SIGKILL)


async def test_audit_filters_verifies_and_exports_for_the_operator_alone(served: Daemon, tmp_path: Path) -> None:
    exported = tmp_path / "audit.jsonl"
    app = ApplianceApp(settings=served.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        await settle(pilot, lambda: rows(app, "#audit"))
        assert "api.read" not in {row[3] for row in rows(app, "#audit").values()}  # the console's own looking
        assert "filters: none; reads hidden (r shows them)" in text(app, "#audit-shown")
        await pilot.press("r")
        await settle(pilot, lambda: "api.read" in {row[3] for row in rows(app, "#audit").values()},
                     message="r did not show who read what")
        await pilot.press("r")
        await pilot.press("f", *"last week", "enter")
        await settle(pilot, lambda: "last week" in notices(app), message="a bad filter was not explained")
        app.screen.query_one("#since").value = ""
        app.screen.query_one("#action").focus()
        await pilot.press(*"model.*", "enter")
        await settle(pilot, lambda: {row[3].split(".")[0] for row in rows(app, "#audit").values()} == {"model"},
                     message="the action filter was not applied")
        assert "filters: action model.*" in text(app, "#audit-shown")
        shown = len(rows(app, "#audit"))

        await pilot.press("v")
        await settle(pilot, lambda: app.screen.query(".verdict-title"), message="no verdict")
        assert str(app.screen.query_one(".verdict-title").render()) == "AUDIT LOG VERIFIED: OK"
        await pilot.press("enter")

        await pilot.press("e")
        assert app.screen.query_one("#path").value.startswith(str(Path.home()))  # not wherever the TUI started
        app.screen.query_one("#path").value = str(exported)
        await pilot.press("enter")
        await settle(pilot, lambda: exported.exists() and "exported to" in notices(app))
        await pilot.press("e")
        app.screen.query_one("#path").value = str(exported)
        await pilot.press("enter")
        await settle(pilot, lambda: "exists already" in text(app, "#problem"))
    assert stat.S_IMODE(os.stat(exported).st_mode) == 0o600
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(records) >= shown and {record["action"].split(".")[0] for record in records} == {"model"}
    (export,) = api(served, "/v1/audit?action=audit.export")
    assert export["details"]["filters"] == {"action": "model.*", "reads": False}


async def test_a_tampered_log_is_shown_as_tampered(daemon: Daemon) -> None:
    conn = sqlite3.connect(daemon.settings.db_path)  # what an attacker with the database file could do
    conn.execute("DROP TRIGGER IF EXISTS audit_no_update")
    conn.execute("UPDATE audit SET actor = 'user:mallory' WHERE seq = 1")
    conn.commit()
    conn.close()
    app = ApplianceApp(settings=daemon.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6", "v")
        await settle(pilot, lambda: app.screen.query(".verdict-title"), message="no verdict")
        assert str(app.screen.query_one(".verdict-title").render()) == "AUDIT LOG TAMPERED"
        assert "first bad record: 1" in {str(label.render()) for label in app.screen.query("Label")}
        await pilot.press("enter", "1")
        await settle(pilot, lambda: "TAMPERED (first bad record 1)" in text(app, "#served"))


async def test_what_a_caller_put_in_the_audit_log_is_shown_as_written_never_as_markup(daemon: Daemon) -> None:
    with daemon.api("apu_nope") as http:  # refused, and audited with its path: Rich markup, then an escape sequence
        assert http.get("/v1/jobs/[on black black]hidden%1B[2K").status_code == 401
    app = ApplianceApp(settings=daemon.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        await settle(pilot, lambda: rows(app, "#audit"))
        refused = [row[2:4] + row[5:] for row in rows(app, "#audit").values() if row[3] == "api.refused"]
        assert refused == [["anonymous", "api.refused", "GET /v1/jobs/[on black black]hidden?[2K"]], refused


async def test_losing_and_regaining_the_daemon_keeps_the_screens(daemon: Daemon) -> None:
    app = ApplianceApp(settings=daemon.settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        await settle(pilot, lambda: rows(app, "#audit"))
        daemon.stop()
        await settle(pilot, lambda: app.connection is Connection.UNREACHABLE, message="the loss was not noticed")
        status = text(app, "#status")
        assert f"NOT REACHABLE, retrying · showing data as of {app.answered_at:%H:%M:%S}" in status
        assert f"nothing listens on {daemon.settings.socket_path}" in status and "'appliance daemon'" in status
        assert rows(app, "#audit") and app.screen.query_one("#body").has_class("stale")  # the last data, greyed
        await pilot.press("3")
        await settle(pilot, lambda: app.screen.query_one("#body").has_class("stale"), message="a live-looking screen")
        daemon.start()
        await settle(pilot, lambda: app.connection is Connection.CONNECTED, message="the TUI did not reconnect")
        assert text(app, "#status") == "connected" and not app.screen.query_one("#body").has_class("stale")


async def test_slash_narrows_a_list_and_greater_than_sorts_it(recorded_app: ApplianceApp) -> None:
    async with recorded_app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        everything = await settle(pilot, lambda: len(found := rows(recorded_app, "#models")) == 4 and found)
        await pilot.press("slash", *"not", "space", *"opt")
        await settle(pilot, lambda: set(rows(recorded_app, "#models")) == {"tickets:1", "tickets:3"})
        await pilot.press("enter")  # kept while the list reloads
        await pilot.pause(2.5)
        assert set(rows(recorded_app, "#models")) == {"tickets:1", "tickets:3"}
        await pilot.press("slash", "escape")
        await settle(pilot, lambda: rows(recorded_app, "#models") == everything)
        await pilot.press("greater_than_sign")  # by version: tickets:1 first, not the newest
        await settle(pilot, lambda: next(iter(rows(recorded_app, "#models"))) == "tickets:1")
        assert "sorted by version" in notices(recorded_app)


async def test_the_palette_finds_screens_and_the_actions_of_the_screen_in_view(recorded_app: ApplianceApp) -> None:
    async with recorded_app.run_test(size=SIZE) as pilot:
        await pilot.press("6", "ctrl+p", *"verify", "enter")
        await settle(pilot, lambda: recorded_app.screen.query(".verdict-title"), message="verify was not found")
        await pilot.press("enter", "ctrl+p", *"show", "space", *"models", "enter")
        await settle(pilot, lambda: recorded_app.current_mode == "models")


async def test_a_terminal_too_small_is_told_so_until_it_is_large_enough(recorded_app: ApplianceApp) -> None:
    async with recorded_app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        assert "needs a terminal of at least 80x24; this one is 60x20" in text(recorded_app, "#too-small")
        await pilot.press("2")  # no screen behind it moves
        assert recorded_app.current_mode == "overview"
        await pilot.resize_terminal(80, 24)
        await pilot.press("2")
        assert not recorded_app.screen.query("#too-small") and recorded_app.current_mode == "datasets"


async def test_an_alert_stays_on_the_overview_until_acknowledged(daemon: Daemon) -> None:
    app = ApplianceApp(settings=daemon.settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda: app.connection is Connection.CONNECTED)
        job_id = submit(daemon, "train", {"dataset": "no-such-dataset"})
        await settle(pilot, lambda: f"job {job_id} (train) failed" in notices(app), message="no alert notice")
        await settle(pilot, lambda: "1 open alert (1 shows them)" in text(app, "#status"))
        (alert,) = await settle(pilot, lambda: rows(app, "#alerts").values())
        assert alert[1] == f"job: {job_id}" and f"job {job_id} (train) failed" in text(app, "#alert-detail")
        await pilot.press("a")
        await settle(pilot, lambda: not rows(app, "#alerts"), message="the acknowledged alert stayed")
        await settle(pilot, lambda: text(app, "#status") == "connected")
    assert api(daemon, "/v1/alerts") == [] and api(daemon, "/v1/alerts?all=true")[0]["acknowledged_by"]


async def test_datasets_models_and_jobs_are_deleted_after_a_question_naming_the_command(
        daemon: Daemon, tmp_path: Path) -> None:
    assert daemon.upload(tmp_path / "tickets.csv", name="tickets").status_code == 201
    job_id = submit(daemon, "train", {"dataset": "no-such-dataset"})
    daemon.ended(job_id)
    with store.open(daemon.settings) as opened:
        run_id = runs.create(opened, dataset_id=datasets.get(opened, "tickets").id, base_model="tiny",
                             task=datasets.TEXT, params={}, plan={})
        registry.register(opened, "tickets", run_id=run_id, task=datasets.TEXT, chosen="fp32", reason="only one",
                          variants=[registry.Variant("fp32", "torch-bundle", blobs.put(opened, b"w"), 1, {})])
    app = ApplianceApp(settings=daemon.settings)
    async with app.run_test(size=SIZE) as pilot:
        for key, table, row, command in (("2", "#datasets", "tickets:1", "appliance data delete tickets:1"),
                                         ("3", "#jobs", job_id, f"appliance jobs delete {job_id}"),
                                         ("4", "#models", "tickets:1", "appliance models delete tickets:1")):
            await pilot.press(key)
            await settle(pilot, lambda table=table, row=row: rows(app, table).get(row))
            app.screen.query_one(table, Table).select(row)
            await pilot.press("x")
            assert f"From a shell: {command}" in text(app, ".command")
            await pilot.press("y")
            await settle(pilot, lambda table=table, row=row: row not in rows(app, table),
                         message=f"{row} stayed on {table}")
    assert notices(app).count("deleted") == 3
    assert api(daemon, "/v1/datasets")[0]["deleted_by"] == f"user:{users.LOCAL_ADMIN}"
    assert api(daemon, "/v1/models") == [] and api(daemon, f"/v1/jobs/{job_id}")["type"] == "JobNotFound"


async def test_a_refused_token_is_said_plainly(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPLIANCE_TOKEN", "not-a-token")
    app = ApplianceApp(settings=daemon.settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda: app.connection is Connection.REFUSED)
        assert text(app, "#status").startswith("TOKEN REFUSED")


def _keys(answer: Any) -> Any:
    """The keys of an answer (of its first item, for a list): what the screens read."""
    item = answer[0] if isinstance(answer, list) and answer else answer
    return sorted(item) if isinstance(item, dict) else type(item).__name__


NESTED = {"GET /v1/serving": lambda answer: answer["models"][0]["versions"][0],
          "GET /v1/status": lambda answer: answer["load"], "GET /v1/hardware": lambda answer: answer["plan"],
          f"GET /v1/studies/{RECORDED_STUDY}": lambda answer: answer["trials"][0]["epochs"][0]}


def test_the_recording_for_snapshots_has_the_keys_of_the_live_api(served: Daemon) -> None:
    recorded = RecordedDaemon().answers
    live_job = next(job for job in api(served, "/v1/jobs") if job["status"] == "finished" and job["kind"] == "pipeline")
    if not api(served, "/v1/alerts"):  # a list's keys are those of its first item: the live one needs one
        with store.open(served.settings) as opened:
            alerts.raise_alert(opened, "drift", "tickets", "warning", "tickets:1: drifted")
    searches = [study["id"] for study in api(served, "/v1/studies") if study["trials"]]
    live_study = searches[0] if searches else served.ended(submit(
        served, "tune", {"dataset": "tickets", "budget_s": 30, "deploy": "never", "params": TINY}))["id"]
    with served.api() as http:
        for key, answer in recorded.items():
            if key == "events":
                continue
            method, path = key.split(" ", 1)
            if path.startswith("/v1/runs/"):
                path = f"/v1/runs/{live_job['result']['run_id']}"
            if path.startswith("/v1/studies/"):
                path = f"/v1/studies/{live_study}"
            response = http.request(method, path)
            assert response.status_code < 300, (key, response.text)
            assert _keys(response.json()) == _keys(answer), key
            if key in NESTED:
                assert _keys(NESTED[key](response.json())) == _keys(NESTED[key](answer)), key


async def test_serving_shows_live_accuracy_and_autopilot_decisions_are_announced(recorded_app: ApplianceApp) -> None:
    recorded_app.daemon.answers["events"].append(
        {"seq": 900, "ts": "2026-11-20T14:00:00.000+00:00", "topic": "deploy", "subject": "tickets",
         "kind": "autopilot-promote", "data": {"candidate": 4, "production": 2,
                                               "reason": "the candidate is more accurate on feedback"}})
    async with recorded_app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        found = await settle(pilot, lambda: rows(recorded_app, "#served").get("tickets:4"), message="no versions")
        assert "95%/41" in found and "90%/212" in rows(recorded_app, "#served")["tickets:2"]
        await settle(pilot, lambda: "promoted tickets:4" in notices(recorded_app), message="no autopilot notice")
        assert "more accurate on feedback" in notices(recorded_app)
