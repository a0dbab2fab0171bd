"""The overview: what this box is, what it would do with a job, how it is doing now, and what needs an eye."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.widgets import DataTable, Static

from appliance.core.hardware import format_bytes
from appliance.core.text import counted, duration
from tui.screens.base import ApplianceScreen
from tui.widgets import Table, ago, meter, percent

ROOMY_ROWS = 36  # terminal rows from which the latest changes are shown as well
RECENT_FETCHED = 100  # audit records asked for; the routine ones are left out of what is shown
ROUTINE = ("checkpoint.",)  # saved every few minutes of training: they would push the changes people made out of view


class OverviewScreen(ApplianceScreen):
    NAME = "overview"
    TITLE = "Overview"
    HELP = ("The box at a glance: its hardware and the training plan it implies, the daemon, its jobs and how busy "
            "the machine is, the open alerts (drift, failed jobs, rolled-back canaries, an audit log that does not "
            "verify; a acknowledges the highlighted one), the served models, and when the audit log was last "
            "verified. In a terminal of 36 rows or more, the latest changes from the audit log too: who did what, "
            "and whether it worked.")
    REFRESH_S: ClassVar[float] = 2.0
    BINDINGS: ClassVar = [Binding("a", "acknowledge", "Acknowledge alert")]

    def compose_body(self) -> ComposeResult:
        with Grid(id="overview"):
            yield Static("asking the daemon…", id="hardware", classes="panel", markup=False)
            yield Static("", id="service", classes="panel", markup=False)
            with Vertical(id="alerts-panel", classes="panel"):
                yield Table("when", "alert", id="alerts")
                yield Static("", id="alert-detail", markup=False)
            yield Static("", id="served", classes="panel", markup=False)
            with Vertical(id="recent-panel", classes="panel"):
                yield Table("when", "who", "what", "on", "outcome", id="recent", cursor=False)

    def on_mount(self) -> None:
        super().on_mount()
        self._alerts: dict[str, dict[str, Any]] = {}
        for panel, title in (("hardware", "Hardware and plan"), ("service", "Service and jobs"),
                             ("alerts-panel", "Alerts"), ("served", "Served models and audit"),
                             ("recent-panel", "Recent changes")):
            self.query_one(f"#{panel}").border_title = title

    async def load(self) -> None:
        status = await self.app.request("GET", "/v1/status")
        self.query_one("#service", Static).update(_service(status) + "\n" + _work(status, self.app.job_progress))
        found = await self.app.request("GET", "/v1/alerts")
        self._alerts = {str(alert["id"]): alert for alert in found}
        self.query_one("#alerts", Table).fill(
            (key, (ago(alert["last_at"]), f"{alert['source']}: {alert['subject']}")) for key, alert in self._alerts.items())
        self.query_one("#alerts-panel").border_title = f"Alerts ({len(found)} open)" if found else "Alerts"
        self._show_alert()
        serving = await self.app.request("GET", "/v1/serving")
        self.query_one("#served", Static).update(_served(serving) + "\n" + _audit(status.get("audit_check")))
        hardware = await self.app.request("GET", "/v1/hardware")  # the daemon asks once, then remembers
        self.query_one("#hardware", Static).update(_hardware(hardware))
        if self.has_class("roomy"):
            records = await self.app.request("GET", "/v1/audit", reads=False, limit=RECENT_FETCHED)
            changes = [record for record in reversed(records) if not record["action"].startswith(ROUTINE)]
            self.query_one("#recent", Table).fill(
                (str(record["seq"]), (ago(record["ts"]), record["actor"].removeprefix("user:"), record["action"],
                                      record["object"], record["outcome"])) for record in changes)

    def on_resize(self, event: events.Resize) -> None:
        """A tall terminal has room for the latest changes; 80x24 keeps to what needs an eye."""
        super().on_resize(event)
        self.set_class(event.size.height >= ROOMY_ROWS, "roomy")

    @on(DataTable.RowHighlighted, "#alerts")
    def _show_alert(self) -> None:
        alert = self._alerts.get(self.query_one("#alerts", Table).selected or "")
        self.query_one("#alert-detail", Static).update(
            "none open: drift, failed jobs and rolled-back canaries show here until acknowledged" if alert is None
            else f"{alert['severity'].upper()}: {alert['message']}"
                 + (f" ({alert['count']} times)" if alert["count"] > 1 else ""))

    def action_acknowledge(self) -> None:
        key = self.query_one("#alerts", Table).selected
        if key is not None:
            self.send("POST", f"/v1/alerts/{key}/acknowledge", lambda alert: f"alert {alert['id']} acknowledged")


def _hardware(report: dict[str, Any]) -> str:
    found, plan, model = report["hardware"], report["plan"], report["model"]
    cpu = found["cpu"]
    gpus = "; ".join(f"{g['name']} {format_bytes(g['total_bytes'])}" for g in found["gpus"]) or "none"
    devices = ", ".join(device["name"] for device in found["openvino_devices"]) or "none"
    batch = f"{plan['effective_batch']}" + (f" (= {plan['micro_batch']} x {plan['accumulation']})"
                                            if plan["accumulation"] > 1 else "")
    return "\n".join([
        f"CPU   {cpu['model']}",
        f"      {counted(cpu['physical_cores'], 'core')}, {counted(cpu['logical_cores'], 'thread')}; {' '.join(cpu['flags']) or 'no AVX2'}",
        f"RAM   {format_bytes(found['ram_total_bytes'])}",
        f"GPU   {gpus}",
        f"OpenVINO  {devices}",
        f"Plan for {model['parameters'] / 1e6:.1f}M-parameter {model['path'].rstrip('/').rsplit('/', 1)[-1]}:",
        f"      {plan['device']}, {plan['precision']}, {counted(plan['threads'], 'thread')}, batch {batch}",
        f"      memory ~{format_bytes(plan['estimated_peak_bytes'])} of {format_bytes(plan['budget_bytes'])}",
    ])


def _service(status: dict[str, Any]) -> str:
    load = status["load"]
    memory = load["memory_used_bytes"] / load["memory_total_bytes"]
    disk_used = 1 - load["disk_free_bytes"] / load["disk_total_bytes"]
    lines = [
        f"daemon  pid {status['pid']}, up {duration(status['uptime_s'])}, v{status['version']}",
        f"serving {'READY' if status['serving_ready'] else 'NOT READY'} {status['inference'].split('://')[-1]}",
        f"CPU  {meter(load['cpu_percent'] / 100)} {load['cpu_percent']:.0f}%",
        f"RAM  {meter(memory)} {percent(memory)} of {format_bytes(load['memory_total_bytes'])}",
        f"disk {meter(disk_used)} {format_bytes(load['disk_free_bytes'])} free",
    ]
    for gpu in load["gpus"]:
        lines.append(f"GPU{gpu['index']} {meter(gpu['utilization_percent'] / 100)} {gpu['utilization_percent']:.0f}%,"
                     f" memory {percent(gpu['memory_used_bytes'] / gpu['memory_total_bytes'])}")
    return "\n".join(lines)


def _work(status: dict[str, Any], progress: dict[str, dict[str, Any]]) -> str:
    counts = status["jobs"]
    running = status.get("running_job")
    if running:
        lines = [f"job  {running['id']} ({running['kind']})"
                 + (f", stopping: {running['stopping']}" if running.get("stopping") else "")]
        report = progress.get(running["id"])
        if report and report.get("total_steps"):
            share = report["step"] / report["total_steps"]
            lines.append(f"     {report.get('stage', '')} {meter(share)} {percent(share)}"
                         + (f" eta {duration(report['eta_s'])}" if report.get("eta_s") is not None else ""))
    else:
        lines = ["job  none running" + (f" (they wait: {status['jobs_wait_for']})" if status.get("jobs_wait_for")
                                        else "")]
    lines.append(f"     {counts.get('queued', 0)} queued, {counts.get('finished', 0)} finished, "
                 f"{counts.get('failed', 0)} failed")
    return "\n".join(lines)


def _served(serving: dict[str, Any]) -> str:
    if not serving["models"]:
        return "nothing deployed yet (press 4 for models)"
    lines = []
    for model in serving["models"][:4]:
        versions = ", ".join(f"v{v['version']} {v['variant']} {v['role']}"
                             + (f" {percent(v['traffic_share'])}" if model["canary_percent"] else "")
                             for v in model["versions"])
        lines.append(f"{model['model']}: {versions or 'loading'}" + ("" if model["ready"] else " (NOT READY)"))
    return "\n".join(lines)


def _audit(check: dict[str, Any] | None) -> str:
    if check is None:
        return "audit: never verified (press 6, then v)"
    verdict = "OK" if check["ok"] else f"TAMPERED (first bad record {check['first_bad']})"
    return f"audit: {verdict}, checked {ago(check['at'])} by {check['actor']}"
