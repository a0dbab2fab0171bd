"""`appliance serve`, `deploy`, `rollback` and `predict`: the served model, from the shell."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import click

from appliance import registry
from appliance.cli.base import (
    FiniteRange,
    cli,
    json_option,
    load_settings,
    log_as_service,
    log_format_option,
    opened_store,
    print_json,
)
from appliance.cli.connect import connected
from appliance.core.errors import ServeError
from appliance.core.text import printable, surrogate_at

STDIN_MAX_BYTES = 16 << 20  # the texts `predict -` reads from standard input


@cli.command("serve")
@click.option("--host", help="Address to listen on (default: serve.host, 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: serve.port, 8080).")
@log_format_option
def serve(host: str | None, port: int | None, log_format: str) -> None:
    """Run the inference server in the foreground; deploys and rollbacks take effect while it runs. It logs a line
    per request (serve.access_log) to stderr."""
    import uvicorn

    from appliance.serve.app import server_config
    from appliance.serve.metrics import Metrics
    from appliance.serve.runtime import Runtime

    settings = load_settings()
    with opened_store():  # the key must open the store now, not after the server has started
        pass
    serve_settings = dataclasses.replace(settings.serve, **{k: v for k, v in (("host", host), ("port", port)) if v})
    settings = dataclasses.replace(settings, serve=serve_settings)
    listener = _listening(serve_settings.host, serve_settings.port)
    runtime = Runtime(settings, Metrics(), os.environ.get("APPLIANCE_PASSPHRASE"))
    click.echo(f"serving on {settings.inference_url} (Ctrl-C stops)", err=True)
    log_as_service(log_format)
    uvicorn.Server(server_config(settings, runtime)).run(sockets=[listener])


def _listening(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, before anything says it serves: a port in use or an address this machine does
    not have is an error that says so (uvicorn would log it and exit 3)."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, protocol)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}",
                         hint="give an address of this machine (--host, serve.host) and a port no other program"
                              " listens on (--port, serve.port)") from None
    return listener


@cli.command("deploy")
@click.argument("ref", metavar="MODEL[:VERSION]")
@click.option("--canary", "percent", type=FiniteRange(0, 100, min_open=True),
              help="Send this share of traffic (percent) to the version; production keeps the rest.")
def deploy(ref: str, percent: float | None) -> None:
    """Make a version serve (the newest if none is named): all traffic, or a canary share."""
    with connected() as appliance:  # a daemon audits it under the caller's user
        model, deployed = appliance.deploy(ref, percent)
    if percent is None:
        click.echo(f"{deployed} is production; a running server switches to it once it is loaded and warm")
    else:
        click.echo(f"{deployed} is the canary for {percent:g}% of {model}'s traffic")
        click.echo(f"  promote it with 'appliance deploy {deployed}', stop it with 'appliance rollback {model}'")


@cli.command("rollback")
@click.argument("model")
def rollback(model: str) -> None:
    """Stop a running canary; with none, production goes back to the version it had before."""
    with connected() as appliance:
        done = appliance.rollback(model)
    if done.canary_stopped:
        click.echo(f"the canary of {model} is stopped: production takes all traffic again")
    else:
        click.echo(f"{model} production is back to version {done.production}")


@cli.command("predict")
@click.argument("ref", metavar="MODEL[:VERSION]")
@click.argument("examples", metavar="TEXT_OR_IMAGE...", nargs=-1, required=True)
@json_option
def predict(ref: str, examples: tuple[str, ...], as_json: bool) -> None:
    """Classify texts, or image files for an image model, with a version's chosen variant, in this process: a quick
    check, no server needed. A lone - reads them from standard input, one a line, so that customer texts stay out
    of the process list and the shell's history."""
    import numpy as np

    from appliance import inference, pixels
    from appliance.store import blobs

    with opened_store() as opened:
        version = registry.get(opened, ref)
        servable = inference.load_ir(blobs.read(opened, version.serving_variant().blob_id))
    images = isinstance(servable.reader, pixels.Pictures)
    if examples == ("-",):
        examples = _lines_of_stdin()
    if not images:
        _check_texts(examples)
    inputs = [pixels.load(Path(name)) for name in examples] if images else list(examples)
    probabilities = inference.softmax(inference.predict(servable.compiled, servable.reader, inputs))
    rows = [{"image" if images else "text": example, "label": servable.labels[int(np.argmax(row))],
             "scores": {label: round(float(p), 4) for label, p in zip(servable.labels, row)}}
            for example, row in zip(examples, probabilities)]
    if as_json:
        print_json({"model": version.ref, "variant": version.chosen, "predictions": rows})
        return
    for example, row in zip(examples, rows):
        click.echo(f"{row['label']:<16} {max(row['scores'].values()):.3f}  {printable(example[:60])}")


def _lines_of_stdin() -> tuple[str, ...]:
    """The non-blank lines of standard input, at most STDIN_MAX_BYTES of it."""
    data = click.get_binary_stream("stdin").read(STDIN_MAX_BYTES + 1)
    if len(data) > STDIN_MAX_BYTES:
        raise click.BadParameter(f"standard input holds more than {STDIN_MAX_BYTES >> 20} MiB",
                                 param_hint="TEXT_OR_IMAGE")
    try:
        lines = tuple(line for line in data.decode("utf-8").splitlines() if line.strip())
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"standard input is not UTF-8 text (byte {exc.start + 1})",
                                 param_hint="TEXT_OR_IMAGE") from None
    if not lines:
        raise click.BadParameter("standard input holds no text", param_hint="TEXT_OR_IMAGE")
    return lines


def _check_texts(texts: tuple[str, ...]) -> None:
    """Texts a model can read: not blank, and text at all (bytes that are not UTF-8 reach argv as lone surrogates)."""
    for number, text in enumerate(texts, 1):
        if not text.strip():
            raise click.BadParameter(f"text {number} is empty", param_hint="TEXT_OR_IMAGE")
        if surrogate_at(text) is not None:
            raise click.BadParameter(f"text {number} is not valid UTF-8", param_hint="TEXT_OR_IMAGE")
