"""The model registry: immutable versions with their artifacts and lineage, movable aliases.

A version is written once (triggers refuse updates): the training run it came from
(and through it the dataset version, base model and hyperparameters), each variant's
artifact blob with the metrics measured on this box, the variant chosen to serve and
why. Which version serves is an alias (`production`, `candidate`), as MLflow's aliases
are; deploy moves one, rollback undoes the last move. Every move is kept, so the
history of what served when can be replayed.

Beside it, what is recorded about the versions as they serve: feedback.py (predictions
and their true labels) and usage.py (what each model and job cost).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

from appliance.core import clock, schema
from appliance.core.errors import RegistryError, VersionNotFound
from appliance.core.text import whole_number
from appliance.store import Store, audit, blobs, events
from appliance.train import runs

ALIASES = ("production", "candidate")


@dataclass(frozen=True)
class Variant:
    """One artifact of a version: fp32, int8, a student; with what it scored here."""

    name: str
    format: str  # openvino-ir | onnx | torch-bundle
    blob_id: str
    bytes: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class ModelVersion:
    model: str
    version: int
    run_id: str
    task: str
    chosen: str
    reason: str
    created_at: str
    variants: dict[str, Variant]
    aliases: tuple[str, ...]

    @property
    def ref(self) -> str:
        return f"{self.model}:{self.version}"

    @property
    def servable(self) -> bool:
        """Whether the server (and `appliance predict`) can run it: its chosen variant is an OpenVINO IR."""
        return self.variants[self.chosen].format == "openvino-ir"

    def serving_variant(self) -> Variant:
        """The chosen variant, if it is an OpenVINO IR (what the server and `appliance predict` run)."""
        variant = self.variants[self.chosen]
        if variant.format != "openvino-ir":
            raise RegistryError(f"{self.ref} is not optimised, so the server cannot run it",
                                hint=f"'appliance optimize {self.ref}' makes a version that can serve")
        return variant

    def summary(self) -> dict[str, Any]:
        """The version as JSON (`models list --json`, the control API), with whether it can serve."""
        return {**asdict(self), "servable": self.servable}

    def lineage(self, store: Store) -> dict[str, Any]:
        """Where this version came from: run, dataset version, base model, hyperparameters, where it trained."""
        run = runs.get(store, self.run_id)
        return {"run": run.id, "dataset": run.dataset_id, "base_model": run.base_model, "params": run.params,
                "trained_on": run.trained_on or "this appliance"}


def register(
    store: Store,
    model: str,
    *,
    run_id: str,
    task: str,
    variants: list[Variant],
    chosen: str,
    reason: str,
    actor: str | None = None,
) -> ModelVersion:
    """Record a new immutable version. It takes no traffic and moves no alias: only deploy() does that (`candidate`
    is the version a canary sends its share to, so a registration must never redirect a running canary)."""
    check_name(model)
    if chosen not in {variant.name for variant in variants}:
        raise RegistryError(f"the chosen variant {chosen!r} is not among the artifacts")
    held = store.db.execute("SELECT task FROM model_versions WHERE model = ? LIMIT 1", (model,)).fetchone()
    if held is not None and held[0] != task:  # its clients send what its versions take: one task per name
        raise RegistryError(f"{model} holds {held[0]} versions, and this one is for {task}",
                            hint="register it under a name of its own (--name)")
    with audit.operation(store, "model.register", model, actor=actor, run=run_id, chosen=chosen) as details:
        version = store.db.execute(  # a deleted version's number is not given again
            "SELECT COALESCE(MAX(version), 0) + 1 FROM (SELECT version FROM model_versions WHERE model = ?"
            " UNION ALL SELECT version FROM model_versions_deleted WHERE model = ?)", (model, model)
        ).fetchone()[0]
        store.db.execute(
            "INSERT INTO model_versions (model, version, run_id, task, chosen, reason, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (model, version, run_id, task, chosen, reason, clock.stamp()),
        )
        for variant in variants:
            store.db.execute(
                "INSERT INTO model_artifacts (model, version, variant, format, blob_id, bytes, metrics)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (model, version, variant.name, variant.format, variant.blob_id, variant.bytes,
                 json.dumps(variant.metrics)),
            )
        details["version"] = version
    return get(store, f"{model}:{version}")


def trained_on(store: Store, dataset_ids: Collection[str]) -> list[str]:
    """The versions (name:version) trained on any of these dataset versions: what changing them affects."""
    trained = {run.id for run in runs.list_runs(store) if run.dataset_id in dataset_ids}
    return [version.ref for version in list_versions(store) if version.run_id in trained]


def check_name(model: str) -> str:
    """The name, if a model may have it."""
    return schema.check_name(model, "model", RegistryError)


def get(store: Store, ref: str) -> ModelVersion:
    """A version by 'name:3', 'name@production', or 'name' (production, else the newest)."""
    model, _, rest = ref.partition(":")
    model, _, alias = model.partition("@")
    if rest:
        version = _int(rest, ref)
    elif alias:
        version = _alias_version(store, model, alias)
        if version is None:
            raise VersionNotFound(f"model {model} has no {alias} alias", hint=f"'appliance models show {model}'")
    else:
        version = _alias_version(store, model, "production") or newest(store, model)
    return _load(store, model, version)


def describe(store: Store, ref: str) -> dict[str, Any]:
    """One version as people read it (`models show`, the control API): its summary and where it came from."""
    version = get(store, ref)
    return {**version.summary(), "lineage": version.lineage(store)}


def list_versions(store: Store) -> list[ModelVersion]:
    rows = store.db.execute("SELECT model, version FROM model_versions ORDER BY model, version").fetchall()
    return [_load(store, model, version) for model, version in rows]


def set_alias(store: Store, model: str, alias: str, version: int, actor: str | None = None) -> int | None:
    """Point alias at version (deploy); returns the version it pointed at before."""
    _check_alias(alias)
    _load(store, model, version)  # refuses an unknown version
    with audit.operation(store, "model.alias", f"{model}@{alias}", actor=actor, version=version) as details:
        previous = _alias_version(store, model, alias)
        _move(store, model, alias, version, "set")
        details["previous"] = previous
    return previous


def rollback(store: Store, model: str, alias: str = "production", actor: str | None = None) -> int:
    """Undo the last move of alias: it points where it pointed before; returns that version."""
    _check_alias(alias)
    with audit.operation(store, "model.rollback", f"{model}@{alias}", actor=actor) as details:
        newest(store, model)  # VersionNotFound for a model that does not exist
        stack = _history(store, model, alias)
        if len(stack) < 2:
            raise RegistryError(
                f"{model}@{alias} has no earlier version to roll back to",
                hint=f"'appliance models show {model}' lists its versions",
            )
        details.update({"from": stack[-1], "to": stack[-2]})
        _move(store, model, alias, stack[-2], "rollback")
        events.emit(store, "deploy", model, "rollback", {"alias": alias, "from": stack[-1], "to": stack[-2]})
    return stack[-2]


def deploy(store: Store, ref: str, canary_percent: float | None = None, actor: str | None = None) -> ModelVersion:
    """Serve a version: as production (any canary ends), or as a candidate taking canary_percent of traffic."""
    version = get(store, ref if ":" in ref or "@" in ref else f"{ref}:{newest(store, ref)}")
    version.serving_variant()  # refuses a version the server could not load
    if canary_percent is None:
        with audit.operation(store, "model.deploy", version.ref, actor=actor):
            set_alias(store, version.model, "production", version.version, actor=actor)
            _end_canary(store, version.model)
            events.emit(store, "deploy", version.model, "production", {"version": version.version})
        return get(store, version.ref)
    if not 0 < canary_percent <= 100:
        raise RegistryError(f"a canary share must be above 0 and at most 100 percent, not {canary_percent:g}")
    production = _alias_version(store, version.model, "production")
    if production is None or production == version.version:
        raise RegistryError(
            f"{version.ref} cannot be a canary: "
            + ("nothing serves in production yet" if production is None else "it already serves in production"),
            hint=f"deploy a version without --canary first: 'appliance deploy {version.model}:VERSION'",
        )
    with audit.operation(store, "model.canary", version.ref, actor=actor, percent=canary_percent):
        set_alias(store, version.model, "candidate", version.version, actor=actor)
        _set_canary(store, version.model, canary_percent)
        events.emit(store, "deploy", version.model, "canary", {"version": version.version, "percent": canary_percent})
    return get(store, version.ref)


def delete(store: Store, ref: str, actor: str | None = None) -> ModelVersion:
    """Delete a version and its weights, unless it serves, is the candidate, or a rollback could return to it.

    Its artifacts' blobs go once nothing else holds them, and the weights of the run it came from go with the
    last version made from that run; the run itself, its curve and the audit records stay.
    """
    with audit.operation(store, "model.delete", ref, actor=actor) as details:
        version = get(store, ref)
        _refuse_in_use(store, version)
        store.db.execute("DELETE FROM model_artifacts WHERE model = ? AND version = ?", (version.model, version.version))
        store.db.execute("DELETE FROM model_versions WHERE model = ? AND version = ?", (version.model, version.version))
        store.db.execute("INSERT INTO model_versions_deleted (model, version, deleted_at, deleted_by) VALUES"
                         " (?, ?, ?, ?)", (version.model, version.version, clock.stamp(),
                                           actor or audit.default_actor()))
        for variant in version.variants.values():
            blobs.release(store, variant.blob_id)
        if not store.db.execute("SELECT 1 FROM model_versions WHERE run_id = ?", (version.run_id,)).fetchone():
            runs.drop_model(store, version.run_id)
        details.update(version=version.ref, variants=sorted(version.variants))
    return version


def _refuse_in_use(store: Store, version: ModelVersion) -> None:
    if version.aliases:
        raise RegistryError(f"{version.ref} is the {' and '.join(version.aliases)} version of {version.model}, so it"
                            " cannot be deleted",
                            hint=f"deploy another version or roll back first ('appliance models show {version.model}')")
    for alias in ALIASES:
        if version.version in _history(store, version.model, alias):
            raise RegistryError(f"{version.ref} cannot be deleted: a rollback of {version.model}@{alias} could return"
                                " to it", hint="delete versions that never served, or keep this one")


@dataclass(frozen=True)
class Deployment:
    """What a model's aliases say should serve now: its production version, the candidate and its share."""

    production: int
    candidate: int | None
    canary_percent: float  # 0: no canary runs, whatever the candidate alias says
    production_since: str  # when production last moved
    canary_since: str | None  # when the canary share was last set


@dataclass(frozen=True)
class AliasMove:
    """One move of an alias: set by a deploy, or a rollback to where it pointed before."""

    model: str
    alias: str
    version: int
    kind: str  # set | rollback
    moved_at: str


def deployments(store: Store) -> dict[str, Deployment]:
    """Every model with a production version, by name: what the inference server should serve."""
    aliases: dict[str, dict[str, tuple[int, str]]] = {}
    for model, alias, version, moved_at in store.db.execute(
            "SELECT model, alias, version, moved_at FROM model_aliases ORDER BY model"):
        aliases.setdefault(model, {})[alias] = (version, moved_at)
    canaries = {model: (percent, set_at) for model, percent, set_at in
                store.db.execute("SELECT model, percent, set_at FROM model_canary")}
    found = {}
    for model, moved in aliases.items():
        if "production" in moved:
            percent, set_at = canaries.get(model, (0.0, None))
            candidate = moved["candidate"][0] if "candidate" in moved else None
            found[model] = Deployment(moved["production"][0], candidate, percent, moved["production"][1], set_at)
    return found


def alias_moves(store: Store) -> list[AliasMove]:
    """Every move of every alias, oldest first: the history of what served when."""
    return [AliasMove(*row) for row in store.db.execute(
        "SELECT model, alias, version, kind, moved_at FROM model_alias_moves ORDER BY seq")]


def canary_percent(store: Store, model: str) -> float:
    """The share of a model's traffic its candidate gets now (0: none)."""
    row = store.db.execute("SELECT percent FROM model_canary WHERE model = ?", (model,)).fetchone()
    return row[0] if row else 0.0


def stop_canary(store: Store, model: str, actor: str | None = None) -> None:
    """All traffic back to production; no version is the candidate any more."""
    with audit.operation(store, "model.canary_stop", model, actor=actor, percent=canary_percent(store, model)):
        _end_canary(store, model)
        events.emit(store, "deploy", model, "canary-stopped", {})


def _set_canary(store: Store, model: str, percent: float) -> None:
    store.db.execute(
        "INSERT OR REPLACE INTO model_canary (model, percent, set_at) VALUES (?, ?, ?)", (model, percent, clock.stamp())
    )


def _end_canary(store: Store, model: str) -> None:
    _set_canary(store, model, 0.0)
    store.db.execute("DELETE FROM model_aliases WHERE model = ? AND alias = 'candidate'", (model,))


def _move(store: Store, model: str, alias: str, version: int, kind: str) -> None:
    now = clock.stamp()
    store.db.execute(
        "INSERT OR REPLACE INTO model_aliases (model, alias, version, moved_at) VALUES (?, ?, ?, ?)",
        (model, alias, version, now),
    )
    store.db.execute(
        "INSERT INTO model_alias_moves (model, alias, version, kind, moved_at) VALUES (?, ?, ?, ?, ?)",
        (model, alias, version, kind, now),
    )


def _history(store: Store, model: str, alias: str) -> list[int]:
    """The alias's versions as a stack: a set pushes, a rollback pops."""
    stack: list[int] = []
    for version, kind in store.db.execute(
        "SELECT version, kind FROM model_alias_moves WHERE model = ? AND alias = ? ORDER BY seq", (model, alias)
    ):
        if kind == "rollback":
            stack.pop()
        else:
            stack.append(version)
    return stack


def _alias_version(store: Store, model: str, alias: str) -> int | None:
    _check_alias(alias)
    row = store.db.execute("SELECT version FROM model_aliases WHERE model = ? AND alias = ?", (model, alias)).fetchone()
    return row[0] if row else None


def newest(store: Store, model: str) -> int:
    """The model's highest version number; VersionNotFound when no version of it exists."""
    row = store.db.execute("SELECT MAX(version) FROM model_versions WHERE model = ?", (model,)).fetchone()
    if row[0] is None:
        raise VersionNotFound(f"no model named {model[:80]!r}", hint="'appliance models list' shows the models")
    return row[0]


def _load(store: Store, model: str, version: int) -> ModelVersion:
    row = store.db.execute(
        "SELECT run_id, task, chosen, reason, created_at FROM model_versions WHERE model = ? AND version = ?",
        (model, version),
    ).fetchone()
    if row is None:
        deleted = store.db.execute("SELECT deleted_at, deleted_by FROM model_versions_deleted WHERE model = ?"
                                   " AND version = ?", (model, version)).fetchone()
        if deleted:
            raise VersionNotFound(f"{model}:{version} was deleted on {deleted[0][:19]} by {deleted[1]}",
                                  hint=f"'appliance models list' shows the versions of {model} kept")
        newest(store, model)  # names the model if it does not exist at all
        raise VersionNotFound(f"model {model} has no version {version}", hint=f"'appliance models show {model}'")
    variants = {
        name: Variant(name, fmt, blob_id, size, json.loads(metrics))
        for name, fmt, blob_id, size, metrics in store.db.execute(
            "SELECT variant, format, blob_id, bytes, metrics FROM model_artifacts WHERE model = ? AND version = ?",
            (model, version),
        )
    }
    aliases = tuple(
        r[0]
        for r in store.db.execute(
            "SELECT alias FROM model_aliases WHERE model = ? AND version = ? ORDER BY alias", (model, version)
        )
    )
    return ModelVersion(model, version, *row, variants=variants, aliases=aliases)


def _check_alias(alias: str) -> None:
    if alias not in ALIASES:
        raise RegistryError(f"unknown alias {alias!r}", hint=f"aliases are {', '.join(ALIASES)}")


def _int(text: str, ref: str) -> int:
    if (number := whole_number(text)) is None:
        raise RegistryError(f"{ref[:80]!r}: the version must be a version number (digits, at most 18)",
                            hint="write MODEL, MODEL:VERSION or MODEL@ALIAS")
    return number
