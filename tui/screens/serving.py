"""Serving: what answers requests, how fast and how well (live accuracy on feedback), whether inputs drift;
and a box to try a model."""

from __future__ import annotations

import asyncio
import base64
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Input, Label, Select, Static

from appliance import pixels
from appliance.core import clock
from appliance.core.errors import ApplianceError
from tui.screens.base import ApplianceScreen
from tui.widgets import Table, number, percent

USAGE_DAYS = 7


class ServingScreen(ApplianceScreen):
    NAME = "serving"
    TITLE = "Serving"
    HELP = ("The inference server: its endpoints, and per model version its variant, share of the traffic, "
            "requests per second, latency in ms (p50 and p99) and error rate over the last minute, its accuracy on "
            "the true labels sent back for its predictions of the last day (acc: 90%/212 is 90% of 212 labels), and "
            "the drift of its inputs from the training data (the worst PSI and its feature: len, tok, lab, con; an "
            "image model's sid and bri, the size and brightness of its images; above 0.2 is worth a look). Below, "
            "usage over the last week per day, user (or API key) and model: inference requests and seconds, job CPU "
            "and GPU hours. t puts the cursor in the box to try a prediction: a text, or a photo's path for an image "
            "model (read here and sent).")
    BINDINGS: ClassVar = [Binding("t", "try_it", "Try a prediction"), Binding("escape", "leave_box", show=False)]
    AUTO_FOCUS = "#served"

    def compose_body(self) -> ComposeResult:
        yield Static("asking the daemon…", id="endpoints", markup=False)
        yield Table("model", "v", "role", "var", "share", "req/s", "p50", "p99", "errs", "acc", "drift", id="served")
        yield Table("day", "user or key", "model", "requests", "infer s", "CPU h", "GPU h", id="usage", cursor=False)
        with Horizontal(id="try"):
            yield Label("Try", classes="field")
            yield Select([], prompt="model", id="try-model")
            yield Input(placeholder="type a text (an image model: a photo's path), then Enter", id="try-text")
        yield Static("", id="try-result", markup=False)

    def on_mount(self) -> None:
        super().on_mount()
        self._offered: list[str] | None = None
        self._takes: dict[str, str] = {}  # what each served model takes: texts or images

    async def load(self) -> None:
        serving = await self.app.request("GET", "/v1/serving")
        models = serving["models"]
        lines = [f"inference server {serving['inference_url']}: {'READY' if serving['ready'] else 'NOT READY'}"
                 + (f"; rates over the last {serving['window_s']:.0f} s" if serving["window_s"] else "")]
        if serving["grpc_address"]:
            lines.append(f"  gRPC (Open Inference Protocol) on {serving['grpc_address']}")
        lines += [f"  {model['model']}: POST {model['endpoints']['predict']}" for model in models[:2]]
        if not models:
            lines.append("nothing deployed: deploy a version on the Models screen (4, then d)")
        self.query_one("#endpoints", Static).update("\n".join(lines))
        self.query_one(Table).fill(
            (f"{model['model']}:{version['version']}", _row(model, version))
            for model in models for version in model["versions"])
        self._offer([model["model"] for model in models])
        self._takes = {model["model"]: model["takes"] for model in models}
        since = (clock.now().date() - timedelta(days=USAGE_DAYS - 1)).isoformat()
        self.query_one("#usage", Table).fill(
            (f"{row['day']} {row['user']} {row['model']}", _usage_row(row))
            for row in reversed(await self.app.request("GET", "/v1/usage", since=since)))

    def _offer(self, names: list[str]) -> None:
        """The models to try, kept as they are while the list does not change (so a choice is not lost)."""
        select = self.query_one("#try-model", Select)
        if names == self._offered:
            return
        self._offered = names
        chosen = select.value
        select.set_options((name, name) for name in names)
        if chosen in names:
            select.value = chosen
        elif names:
            select.value = names[0]

    def action_try_it(self) -> None:
        self.query_one("#try-text", Input).focus()

    def action_leave_box(self) -> None:
        self.query_one(Table).focus()

    @on(Input.Submitted, "#try-text")
    @work(exclusive=True, group="try", exit_on_error=False)
    async def _try(self, event: Input.Submitted) -> None:
        model, text = self.query_one("#try-model", Select).value, event.value.strip()
        result = self.query_one("#try-result", Static)
        if not isinstance(model, str) or not text:
            result.update("choose a served model and type a text (or, for an image model, a photo's path)")
            return
        try:
            images = self._takes.get(model) == "images"
            photo = await asyncio.to_thread(pixels.load, Path(text).expanduser()) if images else b""
            body = {"images": [base64.b64encode(photo).decode()]} if images else {"texts": [text]}
            answer = await self.app.request("POST", f"/v1/models/{model}/predict", body)
        except ApplianceError as exc:
            result.update(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""))
            return
        result.update(_prediction(answer))


def _row(model: dict[str, Any], version: dict[str, Any]) -> tuple[str, ...]:
    drift = version["drift_psi"]
    worst = max(drift, key=drift.get) if drift else None
    return (model["model"], str(version["version"]), version["role"][:4], version["variant"],
            percent(version["traffic_share"]), number(version["requests_per_s"], "{:.2f}"), number(version["p50_ms"]),
            number(version["p99_ms"]), percent(version["error_rate"], 1), _live(version.get("feedback")),
            f"{drift[worst]:.2f} {worst[:3]}" if worst else "-")


def _live(found: dict[str, Any] | None) -> str:
    """Accuracy on feedback over the last day, and on how many labels."""
    return f"{percent(found['accuracy'])}/{found['feedback']}" if found and found["feedback"] else "-"


def _usage_row(row: dict[str, Any]) -> tuple[str, ...]:
    return (row["day"][5:], row["user"], row["model"], str(row["requests"]), f"{row['inference_hours'] * 3600:.1f}",
            f"{row['cpu_hours']:.3f}", f"{row['gpu_hours']:.3f}")


def _prediction(answer: dict[str, Any]) -> str:
    prediction = answer["predictions"][0]
    ranked = sorted(prediction["scores"].items(), key=lambda item: item[1], reverse=True)
    others = ", ".join(f"{label} {score:.2f}" for label, score in ranked[1:4])
    return (f"{prediction['label']} ({ranked[0][1]:.2f})" + (f"; then {others}" if others else "")
            + f"  [{answer['model']}:{answer['version']} {answer['variant']}]")
