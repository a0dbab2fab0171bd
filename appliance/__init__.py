"""The appliance: fine-tune, optimise and serve models on one server.

One package per layer, each importing only from those below it (docs/architecture.md):

    core/        errors, settings, the clock, names and paths, logs, the host
    samples/     the quickstart's sample dataset
    store/       the one encrypted SQLite database, its audit log, credentials and events
    data/        dataset versions: sources -> validated, encrypted rows
    train/       fine-tuning, checkpoints, runs, searches, distillation
    optimize.py  OpenVINO export, INT8 under the accuracy guard
    inference.py the kernel serving, evaluation and distillation share (no torch)
    registry/    model versions and aliases; feedback and usage recorded against them
    access/      users of the control API and API keys of the inference server
    serve/       the inference server
    operations/  each verb once, the job queue and its worker, bursts, autopilot, erasure
    compliance/  the signed evidence pack
    daemon/      the service: lifecycle, control API, job supervisor, client, doctor
    cli/         the `appliance` command (launch.py: its entry point)
"""

import os

# No library phones home from the appliance, the CLI run by hand included: onnxruntime otherwise queues telemetry in
# ~/.cache/Microsoft (and sends it where it can), and Hugging Face's libraries report their use. Set before any of
# them is imported, in every process that imports the appliance.
for _name, _value in (("ORT_DISABLE_TELEMETRY", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"), ("DO_NOT_TRACK", "1")):
    os.environ.setdefault(_name, _value)


def _decline_openvino_telemetry() -> None:
    """OpenVINO's telemetry (its model converter, NNCF) sends usage data unless ~/intel/openvino_telemetry says 0,
    and has no environment switch: someone who never chose gets what 'opt_in_out --opt_out' writes, someone who
    chose keeps their choice. (The service's unit points HOME at the state directory, where tmpfiles.d writes it.)"""
    try:
        folder = os.path.join(os.path.expanduser("~"), "intel")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        consent = os.open(os.path.join(folder, "openvino_telemetry"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # chosen already, or no home to write in (where the library sends nothing either)
        return
    with os.fdopen(consent, "w") as file:
        file.write("0")


_decline_openvino_telemetry()
