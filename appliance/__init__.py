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
    cli/         the `appliance` command
"""
