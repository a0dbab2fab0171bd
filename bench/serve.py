"""Throughput and latency of `appliance serve` against the servers a user would pick instead, and against no HTTP.

One run, loopback, one model, one client. The bundled all-MiniLM-L6-v2 is fine-tuned on
the sample tickets through the appliance's own CLI in a temporary state directory
(`keys init`, `data import`, `train`, `optimize`, `deploy`, `api-keys create`), so what
is served is exactly what an operator would get. Then these systems answer the same
texts, one text per request:

  appliance serve        `appliance serve` in a subprocess: the deployed version's chosen
                         OpenVINO variant behind dynamic batching, API keys, metrics, drift;
                         its plain JSON endpoint, the cheapest way in over REST
  appliance serve OIP    the same process, its Open Inference Protocol REST endpoint
                         (/v2/models/M/infer): the text as JSON tensor data, the label back
  appliance serve gRPC   a second `appliance serve` with serve.grpc_port set, so that the
                         first holds at rest what the default (gRPC off) holds: the same
                         protocol's ModelInfer, the text as raw contents, the label back as
                         raw contents, the clients' calls multiplexed on one channel as gRPC's
                         guides advise (a channel per client costs each side more CPU: about
                         0.05 ms in the server and 0.1 ms in the client per request at 64
                         clients here). Target: at least the OIP REST throughput at 64
                         clients, and at most its p50 at 1 client
  fastapi+openvino       the peer an engineer would hand-build to serve the same model: FastAPI +
                         uvicorn, one worker, the same chosen OpenVINO variant compiled as the
                         appliance compiles it, one inference per request run inline in an
                         `async def` endpoint, the API key compared in the handler; no
                         batching, metrics, logging or drift. Targets: the appliance at least
                         its throughput and no worse p50 at 1 client (peer_ratio_c1, p50_c1_ms),
                         2.5x its throughput at 64 (peer_ratio_c64)
  ray serve              the serving framework one would pick instead: Ray Serve on a local
                         Ray cluster of this machine's CPUs, one replica with the same chosen
                         OpenVINO variant behind `@serve.batch`, `max_ongoing_requests` raised so
                         batches can form; at each concurrency its batch size and wait are swept
                         (RAY_BATCHING) and the best point kept. Its cluster is up only for its
                         own turn, after the others; its CPU and memory are its processes' sum
  naive fastapi+torch    baseline a, what one writes first: FastAPI + uvicorn in a
                         subprocess, an `async def` endpoint running one PyTorch eager
                         forward pass per request under torch.no_grad, torch's default
                         threads. Its weights are the same version's training bundle, which
                         the child decrypts from the store into memory itself
  naive, 1 torch thread  the same server with torch.set_num_threads(1). On a small box
                         torch's OpenMP threads spin against every other busy process (the
                         client included) and can make the default many times slower; the
                         headline ratio is taken against the faster of the two, so it never
                         rests on that
  in-process batcher     baseline b: the same OpenVINO variant in this process, driven
                         through appliance.serve.batching.Batcher with the server's batching
                         settings and engines (the model compiled for latency and for
                         throughput) and, as the REST endpoints ask, inline inference of a lone
                         text on an idle model: the server minus HTTP, auth and JSON, hence the reference
                         for "at least 85 % of in-process" (inprocess_share_c64)
  in-process threads     also b, without batching: one OpenVINO infer request per client
                         thread, one text per call; it shows what batching buys here
  echo HTTP/1.1, echo gRPC
                         the transports alone: one process answering every OIP infer request
                         with the same fixed answer, no model, over uvicorn (as the appliance
                         runs it: uvloop, httptools) and over grpcio's asyncio server on the
                         same loop (as the appliance runs it), driven by the same clients as
                         OIP REST and gRPC. What gRPC costs more per call here, server and
                         client CPU together, bounds the share of OIP REST's throughput the
                         appliance's gRPC can reach on a box whose cores the client shares
                         (grpc_ceiling_vs_oip_rest), and what it adds to one client's p50
                         bounds its p50 against OIP REST's (grpc_p50_floor_vs_oip_rest)

The client: C workers each send requests back to back, each on its own keep-alive
connection, speaking bare HTTP/1.1 on asyncio streams. It is a load generator, kept as
cheap as wrk or oha are for the same reason: it shares the machine with the server under
test, and whatever CPU it burns comes out of the HTTP systems' share and never out of
the in-process ones'. It costs about 0.1 ms per request. `--client httpx` uses one
httpx.AsyncClient per worker instead (one shared pool of 64 connections would be the
obvious choice, but httpcore walks its whole pool on every request, encode/httpx#3215):
about 1.5-2 ms of client CPU per request, so the difference between the two runs is what
a heavier client on the same cores costs the HTTP systems. The in-process systems get
the same workers, awaiting the batcher or a thread instead of a socket. Every point runs a
warm-up, then a measured window: throughput is the requests completed in the window per
second, latency their p50 and p99 as the client saw them, tokenisation included. The
window is taken in ROUNDS turns (--rounds), the systems taking turns at each concurrency, each turn
after its own warm-up: this box's speed drifts by several percent within minutes, and
turns spread that over every system alike (one window each once put the appliance at 0.86
of the hand-built peer at one client where turns, minutes later, gave 0.95-0.99). The
headline ratios are also given turn by turn (`*_turns` in the JSON line): where they swing
more than the targets' margins, take more turns (--rounds) before reading them. Texts
cycle through the validation split in the same order for every system, and each
system's accuracy is one pass over that split with the labels read from its answers.

The table shows CPU milliseconds per request of the server process and of this process,
and the share of the CPUs that other processes used: trust a row only when that is near
0 %. It also shows each server process's resident memory at the end of each window, and
the report each one's at rest after the run and whether libtorch is mapped into it: the
appliance's serving process holds OpenVINO and tokenizers only (target: under 400 MiB at
rest). The batching settings come from the configuration (APPLIANCE_SERVE_MAX_BATCH_SIZE,
APPLIANCE_SERVE_MAX_DELAY_MS), for the server and the in-process batcher alike. With
`--soak 600`, 8 and 64 clients by turns of a minute then keep appliance serve busy for ten
minutes (so both of its engines serve: a light load's and a crowd's), and its memory at rest
before and after gives rss_growth_mib (target: at most 20); its memory under load at the end of
each turn, compared over the second half, gives rss_growth_late_mib (near 0 once it has levelled
off).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Self

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One key drives the whole load here: the per-key rate limit, which guards a real box against one client, would
# measure itself instead of the server.
os.environ.setdefault("APPLIANCE_SERVE_RATE_LIMIT_PER_S", "0")

import httpx
import numpy as np
import psutil
from pydantic import BaseModel

SAMPLE = Path(__file__).resolve().parent.parent / "appliance" / "samples" / "support_tickets.csv"
MODEL = "tickets"
CONCURRENCY = (1, 8, 64)
ROUNDS = 2  # each point's window, in turns with the other systems (see interleaved()); --rounds
TARGET_VS_NAIVE = 3.0
TARGET_IDLE_RSS_MB = 400  # the serving process holds OpenVINO and tokenizers, never torch
TARGET_PEER_C1, TARGET_PEER_TOP = 1.0, 2.5  # the appliance against the best peer, at 1 and at 64 clients
TARGET_INPROCESS_SHARE = 0.85  # of the same variant's in-process batcher, at 64 clients
TARGET_RSS_GROWTH_MB = 20  # over the soak (--soak)
SOAK_CLIENTS, SOAK_TURN_S = (8, 64), 60.0  # the soak's loads, by turns: the server's two engines
OURS, NAIVE, NAIVE_1T = "appliance serve", "naive fastapi+torch", "naive, 1 torch thread"
PEER = "fastapi+openvino"  # hand-built, as an engineer would: one inference per request
RAY = "ray serve"  # the serving framework one would pick instead, up only for its own turn
PEERS = (PEER, RAY, NAIVE, NAIVE_1T)
RAY_BATCHING = ((4, 0.001), (8, 0.002), (16, 0.005), (32, 0.005), (32, 0.01), (64, 0.01))  # size, wait_s
OURS_OIP = "appliance serve OIP"  # the process of OURS, its Open Inference Protocol REST endpoint
OURS_GRPC = "appliance serve gRPC"  # a second `appliance serve`, with its gRPC port on
BATCHER, THREADS = "in-process batcher", "in-process threads"
ECHO_REST, ECHO_GRPC = "echo HTTP/1.1", "echo gRPC"  # one process: the transports alone, no model
SCORING_CLIENTS = 8
STARTED = time.perf_counter()

Classify = Callable[[str], Awaitable[str]]
Session = Callable[[], AbstractAsyncContextManager[Classify]]  # one per client: its connection, if any


class PredictRequest(BaseModel):
    """The body of the plain endpoint, as the naive server reads it."""

    instances: list[str]


@dataclass(frozen=True)
class System:
    """Something that labels one text per call; pid is its server process, None when it runs in this one."""

    name: str
    session: Session
    pid: int | None = None


@dataclass(frozen=True)
class Point:
    """One system at one concurrency: latencies of the requests that completed in the window, and CPU use."""

    system: str
    concurrency: int
    seconds: float
    latencies: list[float]
    errors: int
    server_cpu_s: float
    client_cpu_s: float
    others: float
    server_rss_mb: float | None  # resident memory of the server process at the window's end
    turns: tuple[float, ...] = ()  # the throughput of each turn the window was taken in (interleaved())

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1000) if self.latencies else float("nan")

    def per_request_ms(self, cpu_s: float) -> float:
        return cpu_s * 1000 / len(self.latencies) if self.latencies else float("nan")


@dataclass(frozen=True)
class Validation:
    texts: list[str]
    labels: list[str]


@dataclass(frozen=True)
class Memory:
    """A server process at rest after the run: what it holds, and whether libtorch is mapped into it."""

    rss_mb: float
    maps_libtorch: bool


@dataclass(frozen=True)
class Results:
    points: list[Point]
    accuracy: dict[str, float]
    notes: list[str]
    validation_size: int
    idle: dict[str, Memory]
    soak: Soak | None = None


@dataclass(frozen=True)
class Soak:
    """appliance serve's memory over the soak: at rest before and after, and under load at the end of each turn."""

    seconds: float
    before_mb: float
    after_mb: float
    turns: list[tuple[int, float]]  # (clients, resident MiB at the turn's end), in order

    @property
    def growth_mb(self) -> float:
        return self.after_mb - self.before_mb

    @property
    def late_growth_mb(self) -> float | None:
        """Growth over the second half of the turns, between turns of the last turn's load: near 0 once the
        memory has levelled off (None with too few turns to tell)."""
        clients = self.turns[-1][0] if self.turns else None
        late = [rss for index, (load, rss) in enumerate(self.turns) if load == clients and index >= len(self.turns) // 2]
        return late[-1] - late[0] if len(late) >= 2 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=SAMPLE, help="CSV or JSONL of text,label (default: the sample)")
    parser.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs (default 3)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per point (default 8)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each window (default 1)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"turns each point's window is taken in, the systems taking turns (default {ROUNDS}; more "
                             "where the box's speed swings: the summary gives each ratio turn by turn)")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)),
                        help="concurrent clients per point, comma-separated (default 1,8,64)")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="raw: bare HTTP/1.1 on asyncio streams (default); httpx: one AsyncClient per client")
    parser.add_argument("--dir", type=Path, help="state directory to use and keep; a model deployed in it is reused")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 epoch, 3 s windows, 0.5 s warm-up")
    parser.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                        help="after the points, 8 and 64 clients by turns on appliance serve this long, its memory "
                             "read at rest before and after and under load after each turn (default 0: none; the "
                             "target is stated for 600)")
    parser.add_argument("--naive-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--naive-threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--peer-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--ray-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--echo-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--echo-grpc-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_server is not None:
        naive_server(args.naive_server, args.naive_threads)
        return
    if args.peer_server is not None:
        peer_server(args.peer_server)
        return
    if args.ray_server is not None:
        ray_server(args.ray_server)
        return
    if args.echo_server is not None:
        echo_server(args.echo_server, args.echo_grpc_port)
        return
    if args.quick:
        args.epochs, args.seconds, args.warmup = 1, 3.0, 0.5
    concurrency = [int(c) for c in args.concurrency.split(",")]

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks stop the servers
    state_dir = args.dir or Path(tempfile.mkdtemp(prefix="appliance-bench-serve-"))
    os.environ["APPLIANCE_STATE_DIR"] = str(state_dir.resolve())
    try:
        token = prepare(args.dataset, args.epochs)
        with Servers(token) as servers:
            results = asyncio.run(run(servers, token, args.client, concurrency, args.warmup, args.seconds, args.rounds,
                                      args.soak))
    finally:
        if args.dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)
    report(results, args)


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


# -- the model, through the appliance's CLI ----------------------------------------------------------


def appliance(*arguments: str) -> str:
    """Run one `appliance` command against the benchmark's state directory; its stdout."""
    done = subprocess.run([sys.executable, "-m", "appliance", *arguments], capture_output=True, text=True,
                          env=os.environ | {"APPLIANCE_DEBUG": "1"}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"'appliance {' '.join(arguments)}' failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def prepare(dataset: Path, epochs: int) -> str:
    """Fine-tune, optimise and deploy the model unless the state directory already serves it; a new API token."""
    if deployed():
        log(f"{os.environ['APPLIANCE_STATE_DIR']} already serves {MODEL}: not trained again")
    else:
        steps = [("keys", "init"), ("data", "import", str(dataset), "--name", MODEL),
                 ("train", "--data", MODEL, "--epochs", str(epochs), "--name", MODEL),
                 ("optimize", f"{MODEL}:1"), ("deploy", f"{MODEL}:2")]
        for step in steps:
            log(f"appliance {' '.join(step)}")
            started = time.perf_counter()
            appliance(*step)
            log(f"  done in {time.perf_counter() - started:.1f} s")
    return json.loads(appliance("api-keys", "create", "bench", "--json"))["token"]


def deployed() -> bool:
    from appliance import registry, store
    from appliance.core import config
    from appliance.core.errors import ApplianceError

    settings = config.load()
    if not settings.db_path.exists():
        return False
    try:
        with store.open(settings) as opened:
            return registry.get(opened, f"{MODEL}@production") is not None
    except ApplianceError:
        return False


def validation_split() -> Validation:
    """The validation texts and labels of the dataset the model was trained on, as the store split them."""
    from appliance import store
    from appliance.core import config
    from appliance.data import datasets

    with store.open(config.load()) as opened:
        data = datasets.load(opened, datasets.get(opened, MODEL))
    return Validation([data.texts[i] for i in data.validation], [data.labels[i] for i in data.validation])


# -- the servers, as subprocesses ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Servers:
    """The HTTP servers, started and ready on entry; their process groups are stopped on every way out."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.grpc_port = free_port()  # of OURS_GRPC, beside its REST port
        self.echo_grpc_port = free_port()  # of the echo process, beside its HTTP/1.1 port
        self.logs = Path(tempfile.mkdtemp(prefix="appliance-bench-serve-logs-"))

    def __enter__(self) -> Self:
        this = [sys.executable, str(Path(__file__).resolve())]
        try:
            self.start(OURS, [sys.executable, "-m", "appliance", "serve", "--port"])
            self.start(OURS_GRPC, [sys.executable, "-m", "appliance", "serve", "--port"])
            self.start(PEER, [*this, "--peer-server"], [])
            self.start(NAIVE, [*this, "--naive-server"], ["--naive-threads", "0"])
            self.start(NAIVE_1T, [*this, "--naive-server"], ["--naive-threads", "1"])
            self.start(ECHO_REST, [*this, "--echo-server"], ["--echo-grpc-port", str(self.echo_grpc_port)])
            for name in self.processes:
                self.wait_ready(name)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        for process in self.processes.values():
            stop(process)
        shutil.rmtree(self.logs, ignore_errors=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def start(self, name: str, command: list[str], options: list[str] | None = None) -> None:
        """Start a server on a free port; one of this file's (given options) reads the API token from stdin."""
        log(f"starting {name}")
        self.ports[name] = port = free_port()
        env = dict(os.environ)
        if name == OURS_GRPC:
            env["APPLIANCE_SERVE_GRPC_PORT"] = str(self.grpc_port)
        with self.log_file(name).open("wb") as output:
            process = subprocess.Popen([*command, str(port), *(options or [])], stdout=output,
                                       stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL if options is None else subprocess.PIPE,
                                       start_new_session=True, env=env)
        self.processes[name] = process
        if process.stdin is not None:
            process.stdin.write(self.token.encode() + b"\n")
            process.stdin.close()

    def wait_ready(self, name: str, timeout: float = 300.0) -> None:
        process, deadline = self.processes[name], time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.tail(name)}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url(name)}/v2/health/ready", timeout=2).status_code == 200:
                    log(f"{name} is ready on port {self.ports[name]}")
                    return
            time.sleep(0.25)
        raise RuntimeError(f"{name} was not ready after {timeout:.0f} s:\n{self.tail(name)}")

    def log_file(self, name: str) -> Path:
        return self.logs / f"{''.join(c if c.isalnum() else '-' for c in name)}.log"

    def tail(self, name: str) -> str:
        return self.log_file(name).read_text(errors="replace")[-3000:]


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, SIGKILL after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)


# -- baseline a: the straightforward server ------------------------------------------------------------


def naive_server(port: int, threads: int) -> None:
    """FastAPI + uvicorn, one PyTorch eager forward pass per request in an async endpoint: the first thing one writes.

    The API token comes on stdin; the weights are the deployed version's training bundle, decrypted from the store
    into memory (the child has the same APPLIANCE_* environment as the appliance). threads 0: torch's default.
    """
    import torch

    from appliance import inference, registry, store
    from appliance.core import archive, config
    from appliance.store import blobs
    from appliance.train.bundle import load_text_classifier

    if threads:
        torch.set_num_threads(threads)
    with store.open(config.load()) as opened:
        version = registry.get(opened, f"{MODEL}@production")
        bundle = blobs.read(opened, version.variants["torch"].blob_id)
    model, reader, manifest = load_text_classifier(archive.unpack(bundle))

    def probabilities(texts: list[str]) -> list[list[float]]:
        feeds = inference.encode(reader, texts, inference.INPUTS)
        inputs = {key: torch.from_numpy(value) for key, value in feeds.items()}
        with torch.no_grad():
            return torch.softmax(model(**inputs).logits, dim=-1).tolist()

    hand_built(port, version.version, manifest["labels"], probabilities)


def hand_built(port: int, version: int, labels: list[str], probabilities: Callable[[list[str]], list[list[float]]]
               ) -> None:
    """The plain endpoint as one writes it by hand: FastAPI + uvicorn, one worker, the key (read from stdin)
    compared in the handler, `probabilities` run inline in an `async def` endpoint."""
    import uvicorn
    from fastapi import FastAPI, Header
    from fastapi.responses import JSONResponse

    token = sys.stdin.readline().strip()
    app = FastAPI()

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v1/models/{name}:predict", response_model=None)
    async def predict(name: str, body: PredictRequest, x_api_key: str | None = Header(None)) -> Any:
        if x_api_key != token:
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        predictions = [{"label": labels[int(np.argmax(row))], "scores": dict(zip(labels, row))}
                       for row in probabilities(body.instances)]
        return {"model": name, "model_version": str(version), "predictions": predictions}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the peer: what an engineer would hand-build ------------------------------------------------------------


def peer_server(port: int) -> None:
    """FastAPI + uvicorn, one worker, the deployed version's chosen OpenVINO variant compiled as the appliance
    compiles it, one inference per request inline in an `async def` endpoint: about twenty lines by hand.

    The API token comes on stdin. Running the model inline serialises requests, which is what one worker of such a
    server does; it spares the thread hand-off a `def` endpoint would pay per request.
    """
    from appliance import inference

    servable, version, _origin = load_served()
    names, infer = inference.bind(servable.compiled)

    def probabilities(texts: list[str]) -> list[list[float]]:
        return inference.softmax(infer(inference.encode(servable.reader, texts, names))).tolist()

    hand_built(port, version, servable.labels, probabilities)


# -- the transports alone ------------------------------------------------------------------------------------


def echo_server(port: int, grpc_port: int) -> None:
    """Every OIP infer request answered with the same label, no model: over uvicorn as the appliance runs it
    (uvloop, httptools) on `port`, and over grpcio's asyncio server on the same loop, as the appliance runs it beside
    REST, on `grpc_port` (with the appliance's options for streams). The API key is not read: the floor of each
    transport, nothing else."""
    import grpc
    import uvicorn

    from appliance.serve.grpc_api import SERVICE, STREAMS, M

    rest_answer = json.dumps({"model_name": MODEL, "outputs": [{"name": "label", "shape": [1, 1],
                                                                "datatype": "BYTES", "data": ["echo"]}]}).encode()
    grpc_answer = M["ModelInferResponse"](model_name=MODEL, raw_output_contents=[b"\x04\x00\x00\x00echo"])

    async def infer(_request: Any, _context: grpc.aio.ServicerContext) -> Any:
        return grpc_answer

    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                  send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            server = grpc.aio.server(options=STREAMS)
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
                "ModelInfer": grpc.unary_unary_rpc_method_handler(
                    infer, request_deserializer=M["ModelInferRequest"].FromString,
                    response_serializer=M["ModelInferResponse"].SerializeToString)}),))
            server.add_insecure_port(f"127.0.0.1:{grpc_port}")
            await receive()
            await server.start()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await server.stop(None)
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(rest_answer)).encode())]})
        await send({"type": "http.response.body", "body": rest_answer})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the framework peer: Ray Serve ---------------------------------------------------------------------------


def ray_server(port: int) -> None:
    """Ray Serve: a local Ray cluster of this machine's CPUs, one replica holding the deployed version's chosen
    OpenVINO variant compiled as the appliance compiles it, texts batched by `@serve.batch`. Its size and wait are
    set between points through POST /configure (Ray Serve's guide: tune both against the load), and
    `max_ongoing_requests` is raised so that batches can form. The plain endpoint's JSON in and out, the API key
    (from stdin) compared in the handler, as in the hand-built peer."""
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    token = sys.stdin.readline().strip()
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    @serve.deployment(max_ongoing_requests=256)
    class Classifier:
        def __init__(self) -> None:
            from appliance import inference

            self.servable, self.version, _origin = load_served()
            self.names, self.infer = inference.bind(self.servable.compiled)

        @serve.batch(max_batch_size=RAY_BATCHING[0][0], batch_wait_timeout_s=RAY_BATCHING[0][1])
        async def probabilities(self, texts: list[str]) -> list[list[float]]:
            from appliance import inference

            logits = self.infer(inference.encode(self.servable.reader, texts, self.names))
            return inference.softmax(logits).tolist()

        async def __call__(self, request: Request) -> Any:
            if request.url.path == "/v2/health/ready":
                return JSONResponse({"ready": True})
            if request.headers.get("x-api-key") != token:
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            body = await request.json()
            if request.url.path == "/configure":
                self.probabilities.set_max_batch_size(body["max_batch_size"])
                self.probabilities.set_batch_wait_timeout_s(body["batch_wait_timeout_s"])
                return JSONResponse(body)
            labels = self.servable.labels
            rows = await asyncio.gather(*(self.probabilities(text) for text in body["instances"]))
            return JSONResponse({"model": MODEL, "model_version": str(self.version), "predictions": [
                {"label": labels[int(np.argmax(row))], "scores": dict(zip(labels, row, strict=True))} for row in rows]})

    serve.run(Classifier.bind(), route_prefix="/")
    while True:  # until `stop` signals the process group, Ray's processes with it
        time.sleep(3600)


async def ray_points(servers: Servers, token: str, validation: Validation, concurrency: Sequence[int],
                     warmup: float, seconds: float) -> tuple[list[Point], float, Memory, str]:
    """Ray Serve in its own turn, after the others (its cluster's processes would load the box meanwhile): at each
    concurrency every batching setting of RAY_BATCHING, the best kept; its accuracy; its memory at rest."""
    from appliance.serve.batching import RELEASE_AFTER_S

    servers.start(RAY, [sys.executable, str(Path(__file__).resolve()), "--ray-server"], [])
    try:
        servers.wait_ready(RAY)
        system = System(RAY, raw_session(servers.url(RAY), token), servers.pid(RAY))
        accuracy = await score(system, validation)
        points, chosen = [], []
        for clients in concurrency:
            tried = []
            for size, wait in RAY_BATCHING:
                async with httpx.AsyncClient(headers={"X-API-Key": token}, timeout=30) as control:
                    answer = await control.post(f"{servers.url(RAY)}/configure",
                                                json={"max_batch_size": size, "batch_wait_timeout_s": wait})
                answer.raise_for_status()
                tried.append(((size, wait), await measure(system, validation.texts, clients, warmup, seconds)))
            (size, wait), best = max(tried, key=lambda found: found[1].throughput)
            points.append(best)
            chosen.append(f"{clients}: {size}/{wait * 1000:g} ms")
        await asyncio.sleep(RELEASE_AFTER_S + 2)
        memory = at_rest(system.pid)
    finally:
        stop(servers.processes.pop(RAY))
    return points, accuracy, memory, "ray serve's best batch size/wait per clients: " + ", ".join(chosen)


# -- the systems as the client sees them ------------------------------------------------------------------


def http_session(base_url: str, token: str) -> Session:
    """Each client its own httpx.AsyncClient and keep-alive connection, posting one text per request."""
    url = f"{base_url}/v1/models/{MODEL}:predict"
    headers = {"X-API-Key": token, "Content-Type": "application/json"}

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Classify]:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=limits, timeout=60.0, headers=headers) as client:

            async def classify(text: str) -> str:
                response = await client.post(url, content=json.dumps({"instances": [text]}).encode())
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
                return response.json()["predictions"][0]["label"]

            yield classify

    return session


def raw_session(base_url: str, token: str, oip: bool = False) -> Session:
    """Each client its own connection, spoken to in bare HTTP/1.1 on asyncio streams: the default load generator.

    The same requests reach the server as from httpx, for a fraction of its CPU, which on a small box is the
    server's CPU too. `oip`: the Open Inference Protocol's infer endpoint instead of the plain one.
    """
    host, port = base_url.removeprefix("http://").split(":")
    path = f"/v2/models/{MODEL}/infer" if oip else f"/v1/models/{MODEL}:predict"
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nX-API-Key: {token}\r\n"
            "Content-Type: application/json\r\n").encode()

    def body(text: str) -> bytes:
        if oip:
            return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
                               "outputs": [{"name": "label"}]}).encode()
        return json.dumps({"instances": [text]}).encode()

    def label(answer: dict[str, Any]) -> str:
        return answer["outputs"][0]["data"][0] if oip else answer["predictions"][0]["label"]

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Classify]:
        streams: list[Any] = []

        async def classify(text: str) -> str:
            if not streams:
                streams.extend(await asyncio.open_connection(host, int(port)))
            reader, writer = streams
            try:
                sent = body(text)
                writer.write(head + b"Content-Length: %d\r\n\r\n" % len(sent) + sent)
                status, headers = _response_head(await reader.readuntil(b"\r\n\r\n"))
                payload = await reader.readexactly(int(headers["content-length"]))
            except BaseException:
                writer.close()
                streams.clear()  # the next call connects again
                raise
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {payload[:200]!r}")
            return label(json.loads(payload))

        try:
            yield classify
        finally:
            if streams:
                streams[1].close()

    return session


def grpc_session(address: str, token: str) -> Session:
    """Requests serialised once per text, the label read from the answer's raw contents: a client as lean as gRPC's
    Python stack allows. All clients of the system share one channel, their calls multiplexed on one HTTP/2
    connection, as gRPC's guides advise; the channel opens with the first client and closes with the last."""
    import grpc

    from appliance.serve.grpc_api import SERVICE, M

    requests: dict[str, bytes] = {}
    channel: list[Any] = []  # while any client runs: the channel, and how many clients hold it

    def request(text: str) -> bytes:
        if text not in requests:
            tensor = M["ModelInferRequest"].InferInputTensor(name="text", datatype="BYTES", shape=[1, 1])
            raw = len(text.encode()).to_bytes(4, "little") + text.encode()
            requests[text] = M["ModelInferRequest"](
                model_name=MODEL, inputs=[tensor], raw_input_contents=[raw],
                outputs=[M["ModelInferRequest"].InferRequestedOutputTensor(name="label")]).SerializeToString()
        return requests[text]

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Classify]:
        if not channel:
            channel.extend([grpc.aio.insecure_channel(address), 0])
        channel[1] += 1
        infer = channel[0].unary_unary(f"/{SERVICE}/ModelInfer")  # bytes in, bytes out

        async def classify(text: str) -> str:
            answer = M["ModelInferResponse"].FromString(
                await infer(request(text), metadata=(("x-api-key", token),), timeout=60))
            return answer.raw_output_contents[0][4:].decode()

        try:
            yield classify
        finally:
            channel[1] -= 1
            if not channel[1]:
                await channel[0].close()
                channel.clear()

    return session


def _response_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = (line.partition(":") for line in lines if line)
    return int(status_line.split(" ", 2)[1]), {name.strip().lower(): value.strip() for name, _, value in fields}


def shared_session(classify: Classify) -> Session:
    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Classify]:
        yield classify

    return session


def batcher_classify(batcher: Any, labels: list[str]) -> Classify:
    """What the server's endpoint does once past HTTP: batch (inline on an idle model, as for a REST request), the
    top label."""

    async def classify(text: str) -> str:
        probabilities = (await batcher.infer([text], inline=True)).probabilities
        return labels[int(probabilities[0].argmax())]

    return classify


def threads_classify(pool: concurrent.futures.ThreadPoolExecutor, servable: Any) -> Classify:
    """One text per call, on the pool thread's own OpenVINO infer request: no batching."""
    from appliance import inference

    names, _ = inference.bind(servable.compiled)
    local = threading.local()

    def infer(text: str) -> str:
        if not hasattr(local, "request"):
            local.request = servable.compiled.create_infer_request()
        logits = local.request.infer(inference.encode(servable.reader, [text], names))[0]
        return servable.labels[int(np.argmax(logits[0]))]

    async def classify(text: str) -> str:
        return await asyncio.get_running_loop().run_in_executor(pool, infer, text)

    return classify


def load_served(throughput: bool = False) -> tuple[Any, int, str]:
    """The production version's chosen variant, compiled as the server compiles it (`throughput`: for batches under
    load too, as `appliance serve` does; a peer's one compiled model is what its engineer would write), its version
    number, and a line on where it came from."""
    from appliance import inference, registry, store
    from appliance.core import config
    from appliance.store import blobs

    with store.open(config.load()) as opened:
        version = registry.get(opened, f"{MODEL}@production")
        servable = inference.load_ir(blobs.read(opened, version.variants[version.chosen].blob_id),
                                    throughput=throughput)
        params = version.lineage(opened)["params"]
    origin = (f"model: {version.ref}, all-MiniLM-L6-v2 fine-tuned {params['epochs']} epochs through the appliance CLI, "
              f"serving its {version.chosen} variant; the naive servers run the same version's torch bundle")
    return servable, version.version, origin


# -- the measurements --------------------------------------------------------------------------------------


async def run(
    servers: Servers, token: str, client: str, concurrency: Sequence[int], warmup: float, seconds: float,
    rounds: int = ROUNDS, soak: float = 0.0,
) -> Results:
    """Accuracy of every system, then each concurrency in turn over every system, so drift hits all alike."""
    from appliance.core import config
    from appliance.serve.batching import RELEASE_AFTER_S, Batcher

    validation = validation_split()
    servable, _version, origin = load_served(throughput=True)
    serve = config.load().serve
    notes = [origin,
             (f"batching: max_batch_size {serve.max_batch_size}, max_delay_ms {serve.max_delay_ms:g} "
              "(APPLIANCE_SERVE_MAX_BATCH_SIZE / _MAX_DELAY_MS), for the server and the in-process batcher")]
    batcher = Batcher.serving(servable, serve)
    batcher.start()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(concurrency), thread_name_prefix="client")
    connect = http_session if client == "httpx" else raw_session
    systems = [System(name, connect(servers.url(name), token), servers.pid(name))
               for name in (*PEERS, OURS) if name != RAY]
    echoes = [System(ECHO_REST, raw_session(servers.url(ECHO_REST), token, oip=True), servers.pid(ECHO_REST)),
              System(ECHO_GRPC, grpc_session(f"127.0.0.1:{servers.echo_grpc_port}", token), servers.pid(ECHO_REST))]
    systems.append(System(OURS_OIP, raw_session(servers.url(OURS), token, oip=True), servers.pid(OURS)))
    systems.append(System(OURS_GRPC, grpc_session(f"127.0.0.1:{servers.grpc_port}", token), servers.pid(OURS_GRPC)))
    systems += [
        System(BATCHER, shared_session(batcher_classify(batcher, servable.labels))),
        # Its own compiled model, as a hand-built server would have: the batcher gives its model's buffers back
        # while quiet, which OpenVINO cannot do safely while another user's inferences start on the same model.
        System(THREADS, shared_session(threads_classify(pool, load_served()[0]))),
    ]
    try:
        accuracy = {system.name: await score(system, validation) for system in systems}
        points = [point for clients in concurrency
                  for point in await interleaved((*systems, *echoes), validation.texts, clients, warmup, seconds,
                                                   rounds)]
        await asyncio.sleep(RELEASE_AFTER_S + 2)  # at rest: nothing in flight, the burst's buffers handed back
        idle = {system.name: at_rest(system.pid) for system in systems if system.pid and system.name != OURS_OIP}
        soaking = await soaked(next(system for system in systems if system.name == OURS), validation.texts,
                               soak) if soak else None
        ray, accuracy[RAY], idle[RAY], chosen = await ray_points(servers, token, validation, concurrency, warmup,
                                                                 seconds)
    finally:
        await batcher.close()
        pool.shutdown(wait=True)
    return Results(points + ray, accuracy, [*notes, chosen], len(validation.texts), idle, soaking)


async def soaked(system: System, texts: Sequence[str], seconds: float) -> Soak:
    """The server's resident memory over `seconds` of load, at rest before and after and at the end of each turn:
    SOAK_CLIENTS by turns of SOAK_TURN_S, so both of its engines serve all along (a light load's batches and a
    crowd's)."""
    from appliance.serve.batching import RELEASE_AFTER_S

    assert system.pid is not None, "the soak reads the server's memory"
    before = at_rest(system.pid).rss_mb
    log(f"soak: {system.name} at {before:.0f} MiB, {' and '.join(map(str, SOAK_CLIENTS))} clients by turns of "
        f"{SOAK_TURN_S:.0f} s for {seconds:.0f} s")
    served, done, turns = 0.0, 0.0, []
    for clients in itertools.cycle(SOAK_CLIENTS):
        window = min(SOAK_TURN_S, seconds - done)
        if window <= 0:
            break
        point = await measure(system, texts, clients, 0.0, window)
        served += point.throughput * window
        done += window
        assert point.server_rss_mb is not None  # measured: the system has a server process
        turns.append((clients, point.server_rss_mb))
        log(f"soak: {done:.0f} s, {clients} clients, {turns[-1][1]:.0f} MiB under load")
    await asyncio.sleep(RELEASE_AFTER_S + 2)
    result = Soak(seconds, before, at_rest(system.pid).rss_mb, turns)
    log(f"soak: {served / seconds:.0f} req/s; at rest {result.after_mb:.0f} MiB, {result.growth_mb:+.0f} MiB")
    return result


async def score(system: System, validation: Validation) -> float:
    """Accuracy over the validation split, one text per request, a few clients at a time."""
    predicted: dict[int, str] = {}
    indices = iter(range(len(validation.texts)))

    async def client() -> None:
        async with system.session() as classify:
            for index in indices:
                predicted[index] = await classify(validation.texts[index])

    await asyncio.gather(*(client() for _ in range(SCORING_CLIENTS)))
    accuracy = float(np.mean([predicted[i] == label for i, label in enumerate(validation.labels)]))
    log(f"{system.name}: validation accuracy {accuracy:.2%}")
    return accuracy


async def interleaved(systems: Sequence[System], texts: Sequence[str], clients: int, warmup: float,
                      seconds: float, rounds: int = ROUNDS) -> list[Point]:
    """Each system's point, measured in `rounds` windows of seconds / rounds taking turns with the others, so that
    the box's speed, which drifts by several percent within minutes, weighs on every system alike. Each round
    starts further along the list, so no system always follows the same one (a heavy one may leave the box slower
    for a moment after it)."""
    turns: dict[str, list[Point]] = {system.name: [] for system in systems}
    for round_ in range(rounds):
        start = round_ * len(systems) // rounds
        for system in (*systems[start:], *systems[:start]):
            turns[system.name].append(await measure(system, texts, clients, warmup, seconds / rounds))
    return [merged(windows) for windows in turns.values()]


def merged(points: list[Point]) -> Point:
    """One system's windows as one: their requests and CPU summed, others weighed by time, the last memory."""
    seconds = sum(point.seconds for point in points)
    return Point(points[0].system, points[0].concurrency, seconds,
                 [latency for point in points for latency in point.latencies], sum(point.errors for point in points),
                 sum(point.server_cpu_s for point in points), sum(point.client_cpu_s for point in points),
                 sum(point.others * point.seconds for point in points) / seconds, points[-1].server_rss_mb,
                 tuple(point.throughput for point in points))


async def measure(system: System, texts: Sequence[str], clients: int, warmup: float, seconds: float) -> Point:
    """Clients send back to back through warm-up and window; the requests that complete in the window count."""
    counter = itertools.count()
    window_start = time.perf_counter() + warmup
    window_end = window_start + seconds
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()  # by what the client was told

    async def client() -> None:
        async with system.session() as classify:
            while (sent := time.perf_counter()) < window_end:
                try:
                    await classify(texts[next(counter) % len(texts)])
                    failed = None
                except Exception as exc:  # noqa: BLE001  an error is counted, the client goes on
                    failed = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                done = time.perf_counter()
                if window_start <= done <= window_end:
                    if failed:
                        errors[failed] += 1
                    else:
                        latencies.append(done - sent)

    usage = asyncio.create_task(cpu_usage(system.pid, window_start, window_end))
    await asyncio.gather(*(client() for _ in range(clients)))
    server_cpu, client_cpu, others = await usage
    rss = _resident_mib(_tree(psutil.Process(system.pid))) if system.pid else None
    point = Point(system.name, clients, seconds, latencies, errors.total(), server_cpu, client_cpu, others, rss)
    for error, count in errors.items():
        log(f"{system.name}, {clients} clients: {count} x {error}")
    log(f"{system.name}, {clients} clients: {point.throughput:.1f} req/s, p50 {point.percentile_ms(50):.1f} ms, "
        f"p99 {point.percentile_ms(99):.1f} ms, {errors} errors, others {others:.0%}")
    return point


async def cpu_usage(pid: int | None, start: float, end: float) -> tuple[float, float, float]:
    """CPU seconds of the server process and of this one over the window, and the share of the CPUs others used."""
    server = psutil.Process(pid) if pid else None
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    before = cpu_readings(server)
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    after = cpu_readings(server)
    wall, machine, own, served = (b - a for a, b in zip(before, after))
    others = max(0.0, (machine - own - served) / (wall * (psutil.cpu_count() or 1)))
    return served, own, others


def at_rest(pid: int) -> Memory:
    """The server's processes (Ray's cluster is several) at rest: resident memory summed, libtorch in any."""
    tree = _tree(psutil.Process(pid))
    mapped = any("libtorch" in Path(f"/proc/{process.pid}/maps").read_text() for process in tree)
    return Memory(_resident_mib(tree), mapped)


def _tree(process: psutil.Process) -> list[psutil.Process]:
    return [process, *process.children(recursive=True)]


def _resident_mib(processes: list[psutil.Process]) -> float:
    return sum(process.memory_info().rss for process in processes) / 2**20


def cpu_readings(server: psutil.Process | None) -> tuple[float, float, float, float]:
    """Wall clock, busy CPU seconds of the machine, of this process and of the server process."""
    machine = psutil.cpu_times()
    not_busy = ("idle", "iowait", "guest", "guest_nice")  # guest time is already counted in user time
    busy = sum(machine) - sum(getattr(machine, name, 0.0) for name in not_busy)
    own = psutil.Process().cpu_times()
    served = 0.0
    for process in _tree(server) if server else []:
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker that ended meanwhile
            times = process.cpu_times()
            served += times.user + times.system
    return time.perf_counter(), busy, own.user + own.system, served


# -- the report --------------------------------------------------------------------------------------------


def report(results: Results, args: argparse.Namespace) -> None:
    from appliance.core import hardware

    cpu = hardware.detect().cpu
    print(f"machine: {cpu.described()}; "
          f"openvino {version('openvino')}, torch {version('torch')}, fastapi {version('fastapi')}, "
          f"uvicorn {version('uvicorn')} ({uvicorn_stack()})")
    for note in results.notes:
        print(note)
    print(f"data: {args.dataset.name}; its {results.validation_size} validation texts, one per request, in a fixed order")
    client = f"httpx {version('httpx')}" if args.client == "httpx" else "bare HTTP/1.1 on asyncio streams"
    print(f"load: each client sends one text per request back to back on its own connection ({client}; the gRPC clients share one channel); "
          f"{args.seconds:g} s measured per point, in {args.rounds} turns taken with the other systems, each after {args.warmup:g} s "
          "of warm-up; the client runs on this machine")
    print()
    table(results.points)
    print()
    print("validation accuracy, one text per request: "
          + ", ".join(f"{name} {value:.2%}" for name, value in results.accuracy.items()))
    busiest = max(point.others for point in results.points)
    if busiest > 0.1:
        print(f"WARNING: other processes used up to {busiest:.0%} of the CPUs during a window: run it again when idle")
    summary(results, max(point.concurrency for point in results.points), args.client)


def table(points: Sequence[Point]) -> None:
    header = (f"{'system':<22} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
              f"{'server CPU ms/req':>17} {'client CPU ms/req':>17} {'others':>6} {'server RSS MiB':>14}")
    print(header)
    print("-" * len(header))
    for point in points:
        server_ms = "-" if point.system in (BATCHER, THREADS) else f"{point.per_request_ms(point.server_cpu_s):.2f}"
        rss = "-" if point.server_rss_mb is None else f"{point.server_rss_mb:.0f}"
        print(f"{point.system:<22} {point.concurrency:>7} {point.throughput:>8.1f} {point.percentile_ms(50):>8.1f} "
              f"{point.percentile_ms(99):>8.1f} {point.errors:>6} {server_ms:>17} "
              f"{point.per_request_ms(point.client_cpu_s):>17.2f} {point.others:>6.0%} {rss:>14}")
    print("(in-process rows: the client CPU column is the whole cost, inference included)")


def summary(results: Results, top: int, client: str) -> None:
    """The ratios at the highest concurrency, the accuracy delta, and the last line: one JSON object.

    Besides throughput, CPU per request: on a box this small the client's CPU comes out of the server's, which the
    in-process batcher never pays, so its CPU ms per request against the server process's says how much of the
    in-process efficiency the server keeps, whatever the client costs and whatever else runs.
    """
    at_top = {point.system: point for point in results.points if point.concurrency == top}
    rate = {name: point.throughput for name, point in at_top.items()}

    def ratio(name: str) -> float:
        return rate[OURS] / rate[name] if rate[name] else 0.0

    ours, batcher = at_top[OURS], at_top[BATCHER]
    efficiency = batcher.per_request_ms(batcher.client_cpu_s) / ours.per_request_ms(ours.server_cpu_s)
    naive = max((NAIVE, NAIVE_1T), key=lambda name: rate[name])
    print(f"at {top} clients: appliance serve / naive = {ratio(naive):.2f}x against the faster naive ({naive}; "
          f"target {TARGET_VS_NAIVE:.1f}x; {ratio(NAIVE):.2f}x against torch's default threads); "
          f"/ in-process batcher = {ratio(BATCHER):.2f} (target {TARGET_INPROCESS_SHARE:.2f}); "
          f"/ in-process threads = {ratio(THREADS):.2f}")
    print(f"CPU per request at {top} clients: in-process batcher {batcher.per_request_ms(batcher.client_cpu_s):.2f} ms, "
          f"appliance serve {ours.per_request_ms(ours.server_cpu_s):.2f} ms in the server + "
          f"{ours.per_request_ms(ours.client_cpu_s):.2f} ms in the client: the server keeps {efficiency:.0%} of the "
          "in-process efficiency")
    print("at rest after the run: " + "; ".join(
        f"{name} {memory.rss_mb:.0f} MiB, libtorch {'mapped' if memory.maps_libtorch else 'not mapped'}"
        for name, memory in results.idle.items()) + f" (target for appliance serve: under {TARGET_IDLE_RSS_MB} MiB)")
    fewest = min(point.concurrency for point in results.points)
    at_fewest = {point.system: point for point in results.points if point.concurrency == fewest}
    grpc_rate = rate[OURS_GRPC] / rate[OURS_OIP] if rate[OURS_OIP] else 0.0
    grpc_p50 = at_fewest[OURS_GRPC].percentile_ms(50) / at_fewest[OURS_OIP].percentile_ms(50)
    print(f"gRPC against OIP REST: {grpc_rate:.2f}x the throughput at {top} clients (target at least 1.0), "
          f"{grpc_p50:.2f}x the p50 at {fewest} client(s) (target at most 1.0); OIP REST against the plain endpoint: "
          f"{rate[OURS_OIP] / rate[OURS]:.2f}x the throughput at {top} clients")
    grpc_extra_ms, grpc_ceiling = grpc_ceiling_at(at_top)
    echo_p50 = {name: at_fewest[name].percentile_ms(50) for name in (ECHO_REST, ECHO_GRPC)}
    grpc_p50_floor = (at_fewest[OURS_OIP].percentile_ms(50) + echo_p50[ECHO_GRPC] - echo_p50[ECHO_REST]
                      ) / at_fewest[OURS_OIP].percentile_ms(50)
    print(f"the transports alone: at {top} clients an echo answers {rate[ECHO_REST]:.0f} calls/s over HTTP/1.1 and "
          f"{rate[ECHO_GRPC]:.0f} over gRPC; gRPC costs {grpc_extra_ms * 1000:.0f} us more CPU per call, server and "
          f"client together, so on this machine the appliance's gRPC can reach at most {grpc_ceiling:.2f}x its OIP "
          f"REST throughput, however lean its own work; at {fewest} client(s) the echo's p50 is "
          f"{echo_p50[ECHO_REST]:.2f} ms over HTTP/1.1 and {echo_p50[ECHO_GRPC]:.2f} ms over gRPC, so its p50 can be "
          f"no better than {grpc_p50_floor:.2f}x OIP REST's")
    rate_fewest = {name: point.throughput for name, point in at_fewest.items()}
    best_c1, best_top = (max(PEERS, key=lambda name: rates[name]) for rates in (rate_fewest, rate))
    peer_c1 = rate_fewest[OURS] / rate_fewest[best_c1] if rate_fewest[best_c1] else 0.0
    peer_top = rate[OURS] / rate[best_top] if rate[best_top] else 0.0
    p50_ours, p50_peer = at_fewest[OURS].percentile_ms(50), at_fewest[best_c1].percentile_ms(50)
    targets_c1 = ((f" (target {TARGET_PEER_C1:.1f})", " (target: no worse)") if fewest == 1
                  else ("", " (the targets are at 1 client, which this run did not measure)"))
    at_most = f"; at {top} clients {peer_top:.2f}x {best_top}'s (target {TARGET_PEER_TOP:.1f})" if top > fewest else ""
    print(f"against the best peer: at {fewest} client(s) {peer_c1:.2f}x {best_c1}'s throughput{targets_c1[0]}, p50 "
          f"{p50_ours:.2f} ms against its {p50_peer:.2f} ms{targets_c1[1]}{at_most}")
    by_turn = {f"peer_ratio_c{fewest}": turn_ratios(at_fewest[OURS], at_fewest[best_c1]),
               f"peer_ratio_c{top}": turn_ratios(at_top[OURS], at_top[best_top]),
               f"inprocess_share_c{top}": turn_ratios(ours, batcher)}
    print("turn by turn (how far the box's own swings move each ratio): " + "; ".join(
        f"{name} {', '.join(f'{value:.2f}' for value in values)}" for name, values in by_turn.items() if values))
    soak = results.soak
    if soak is not None:
        late = "too few turns to tell" if soak.late_growth_mb is None else f"{soak.late_growth_mb:+.0f} MiB"
        print(f"soak: appliance serve's memory at rest grew {soak.growth_mb:+.0f} MiB over {soak.seconds:.0f} s of "
              f"{' and '.join(map(str, SOAK_CLIENTS))} clients by turns (target at most {TARGET_RSS_GROWTH_MB} over "
              f"600 s); under load, at each turn's end: {', '.join(f'{rss:.0f}' for _, rss in soak.turns)} MiB; "
              f"over the second half: {late}")
    accuracy = results.accuracy
    delta_pt = (accuracy[OURS] - max(accuracy[NAIVE], accuracy[NAIVE_1T])) * 100
    print(f"accuracy, appliance serve against naive: {delta_pt:+.1f} pt "
          f"(one validation text is {100 / results.validation_size:.1f} pt)")
    print(json.dumps({
        f"peer_ratio_c{fewest}": round(peer_c1, 2), "target_peer_ratio_c1": TARGET_PEER_C1,
        f"p50_c{fewest}_ms": round(p50_ours, 2), f"peer_p50_c{fewest}_ms": round(p50_peer, 2),
        f"peer_ratio_c{top}": round(peer_top, 2), "target_peer_ratio_c64": TARGET_PEER_TOP,
        f"inprocess_share_c{top}": round(ratio(BATCHER), 2), "target_inprocess_share_c64": TARGET_INPROCESS_SHARE,
        "rss_mib": round(results.idle[OURS].rss_mb), "target_rss_mib": TARGET_IDLE_RSS_MB,
        "rss_growth_mib": None if soak is None else round(soak.growth_mb),
        "target_rss_growth_mib": TARGET_RSS_GROWTH_MB, "soak_s": None if soak is None else soak.seconds,
        "rss_growth_late_mib": None if soak is None or soak.late_growth_mb is None else round(soak.late_growth_mb),
        f"vs_naive_c{top}": round(ratio(naive), 2), "target_vs_naive": TARGET_VS_NAIVE,
        f"vs_naive_default_threads_c{top}": round(ratio(NAIVE), 2),
        f"vs_naive_1thread_c{top}": round(ratio(NAIVE_1T), 2),
        f"vs_inprocess_threads_c{top}": round(ratio(THREADS), 2),
        f"server_cpu_efficiency_vs_inprocess_c{top}": round(efficiency, 2),
        "accuracy": {key(name): round(value, 4) for name, value in accuracy.items()},
        "accuracy_delta_pt": round(delta_pt, 2),
        "serve_maps_libtorch": results.idle[OURS].maps_libtorch,
        f"grpc_vs_oip_rest_c{top}": round(grpc_rate, 2), "target_grpc_vs_oip_rest": 1.0,
        f"grpc_p50_vs_oip_rest_c{fewest}": round(grpc_p50, 2), "target_grpc_p50_vs_oip_rest": 1.0,
        f"grpc_ceiling_vs_oip_rest_c{top}": round(grpc_ceiling, 2),
        f"grpc_p50_floor_vs_oip_rest_c{fewest}": round(grpc_p50_floor, 2),
        f"grpc_transport_extra_us_c{top}": round(grpc_extra_ms * 1000),
        **{f"{name}_turns": [round(value, 2) for value in values] for name, values in by_turn.items()},
        "client": client,
        "others_max": round(max(point.others for point in results.points), 2),
    }))


def turn_ratios(ours: Point, other: Point) -> list[float]:
    """Ours against the other system in each turn they took together (none where the other was not interleaved)."""
    if len(ours.turns) < 2 or len(ours.turns) != len(other.turns):
        return []
    return [mine / theirs if theirs else 0.0 for mine, theirs in zip(ours.turns, other.turns, strict=True)]


def grpc_ceiling_at(points: dict[str, Point]) -> tuple[float, float]:
    """What gRPC's transport costs more than HTTP/1.1's per call (ms of server and client CPU, from the echoes), and
    the share of OIP REST's throughput that leaves the appliance's gRPC when the two processes share the CPUs: all
    else equal, each request would cost that much more of them."""

    def cpu_ms(point: Point) -> float:
        return point.per_request_ms(point.server_cpu_s + point.client_cpu_s)

    extra = cpu_ms(points[ECHO_GRPC]) - cpu_ms(points[ECHO_REST])
    rest = cpu_ms(points[OURS_OIP])
    return extra, rest / (rest + extra) if rest + extra > 0 else 0.0


def key(name: str) -> str:
    return "_".join("".join(c if c.isalnum() else " " for c in name).split())


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def uvicorn_stack() -> str:
    """The event loop and HTTP parser uvicorn picks: uvloop and httptools when installed, else asyncio and h11."""
    loop = "uvloop" if version("uvloop") != "not installed" else "asyncio"
    parser = "httptools" if version("httptools") != "not installed" else "h11"
    return f"{loop} + {parser}"


if __name__ == "__main__":
    main()
