"""`appliance optimize`: a registered model becomes its fastest variant that keeps the accuracy."""

from __future__ import annotations

import click

from appliance.cli.base import cli, schema_option
from appliance.cli.connect import connected
from appliance.cli.models import show_version
from appliance.operations.jobspec import OptimizeJob

distill_option = click.option(
    "--distill", is_flag=True, help="Also distil a smaller, faster student sized for this CPU (minutes to hours: more "
    "on more data), and optimise it too; the guard serves it if it keeps the accuracy.")


@cli.command("optimize")
@click.argument("ref", metavar="MODEL[:VERSION]")
@click.option("--no-int8", is_flag=True, help="Export to OpenVINO FP32 only.")
@distill_option
@schema_option(OptimizeJob, "distill_layers", "--distill-layers", metavar="K",
               help="The student keeps K layers, spread over the teacher's depth (default: half).")
@schema_option(OptimizeJob, "distill_width", "--distill-width", metavar="N",
               help="The student keeps the N most used units of each feed-forward block (default: all, or "
               "fewer on a CPU without native bf16 or int8 when the shape is left open): faster.")
@schema_option(OptimizeJob, "max_accuracy_drop", "--max-accuracy-drop",
               help="Accuracy points a faster variant may lose against FP32.")
@schema_option(OptimizeJob, "calibration_size", "--calibration-size", help="Training texts that calibrate INT8.")
@schema_option(OptimizeJob, "metric", "--metric", help="The validation metric the guard compares.")
@schema_option(OptimizeJob, "max_minutes", "--max-minutes",
               help="Time limit for the whole optimisation: a student learns for fewer epochs where it would pass it.")
def optimize(
    ref: str, no_int8: bool, distill: bool, distill_layers: int | None, distill_width: int | None,
    max_accuracy_drop: float, calibration_size: int, metric: str, max_minutes: float | None,
) -> None:
    """Export to OpenVINO, quantise to INT8 under an accuracy guard, and register the result as a new version."""
    spec = OptimizeJob.parse({"version": ref, "int8": not no_int8, "distill": distill,
                              "distill_layers": distill_layers, "distill_width": distill_width,
                              "max_accuracy_drop": max_accuracy_drop, "calibration_size": calibration_size,
                              "metric": metric, "max_minutes": max_minutes})
    with connected() as appliance:  # a daemon runs it as a job, audited under the caller's user
        ref = appliance.run(spec, "optimising")["version"]
        show_version(appliance.model(ref))
    click.echo(f"serve it with 'appliance deploy {ref}', or beside production first: "
               f"'appliance deploy {ref} --canary 20'")
