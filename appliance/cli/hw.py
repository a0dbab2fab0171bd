"""`appliance hw`: what this server has, and how it would fine-tune a base model on it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from appliance.cli.base import cli, json_option, load_settings, print_json
from appliance.core import hardware
from appliance.core.text import counted


@cli.command("hw")
@json_option
@click.option("--base", type=click.Path(file_okay=False, path_type=Path), help="Local Hugging Face model directory.")
@click.option("--max-length", type=click.IntRange(8, 8192), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True, help="Effective batch.")
def hw(as_json: bool, base: Path | None, max_length: int, batch_size: int) -> None:
    """Show the CPU, memory, GPUs and OpenVINO devices, and the plan for fine-tuning a base model."""
    base = base or load_settings().base_model
    shape = hardware.model_shape(base)
    found = hardware.detect()
    plan = hardware.plan(found, hardware.JobRequest(shape=shape, seq_len=max_length, effective_batch=batch_size))
    if as_json:
        print_json({"hardware": asdict(found), "model": {"path": str(base), **asdict(shape)}, "plan": asdict(plan)})
    else:
        _show(found, base, shape, plan)


def _show(found: hardware.Hardware, base: Path, shape: hardware.ModelShape, plan: hardware.TrainingPlan) -> None:
    cpu = found.cpu
    gpus = [f"{g.name} ({hardware.format_bytes(g.total_bytes)}, sm {g.compute_capability})" for g in found.gpus]
    openvino = [f"{d.name} ({d.full_name})" for d in found.openvino_devices]
    click.echo(f"cpu       {cpu.name}, {cpu.physical_cores} physical / {cpu.logical_cores} logical cores")
    click.echo(f"          flags: {' '.join(cpu.flags) or 'none of ' + ', '.join(hardware.TRAINING_FLAGS)}")
    click.echo(
        f"ram       {hardware.format_bytes(found.ram_available_bytes)} available"
        f" of {hardware.format_bytes(found.ram_total_bytes)}"
    )
    click.echo(f"gpus      {'; '.join(gpus) or 'none'}")
    click.echo(f"openvino  {'; '.join(openvino) or 'none'}")
    for note in found.notes:
        click.echo(f"  ! {note}")
    click.echo()
    click.echo(f"plan for {base}")
    click.echo(f"  ({shape.parameters / 1e6:.1f}M parameters, {shape.layers} layers, hidden {shape.hidden_size})")
    click.echo(f"device    {plan.device}, {plan.precision}, {counted(plan.threads, 'thread')}")
    click.echo(
        f"batch     {plan.effective_batch} as micro-batch {plan.micro_batch} x"
        f" {counted(plan.accumulation, 'accumulation step')}, sequence length {plan.seq_len}"
    )
    click.echo(
        f"memory    about {hardware.format_bytes(plan.estimated_peak_bytes)}"
        f" of a {hardware.format_bytes(plan.budget_bytes)} budget"
    )
    for note in plan.notes:
        click.echo(f"  - {note}")
