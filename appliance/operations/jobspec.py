"""What each kind of job takes: one typed schema per kind, checked once, when the job is submitted.

The control API's body, `appliance jobs submit`, `train`, `tune` and `optimize`, the TUI's wizard and
the autopilot all build these; the jobs table keeps what was given as JSON, and the worker reads it
back typed. So a value that would fail hours later (or crash the job) is refused before the job waits
in the queue, with the field, the value and what the field takes.

Two parameters name things on disk, and only by a name inside a folder root chose, never by a path:
`source`, a file (or an image folder) in daemon.import_dir, and `base`, a model folder in
train.base_models_dir. confine() checks at submission that they resolve there (no links, no '..',
nothing read), and base_dir() checks again when the job runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self, Union

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    RootModel,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from appliance import registry
from appliance.core.config import Settings
from appliance.core.confined import MAX_NAME_CHARS, Folder
from appliance.core.errors import ApplianceError, ConfinementError, JobError
from appliance.core.schema import EXPLAINED, Strict, refusal, shown
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.operations.pipeline import OptimizeOptions
from appliance.train import runs, space, studies
from appliance.train.params import Metric, TrainParams

if TYPE_CHECKING:
    from appliance.store import Store

PRIORITY = (-100, 100)
WEEK_S = 7 * 24 * 3600.0
IMPORT_DIR, BASE_MODELS_DIR = "daemon.import_dir", "train.base_models_dir"


def _model_name(name: str) -> str:
    try:
        return registry.check_name(name)
    except ApplianceError as exc:
        raise refusal(f"{shown(name)} is not a usable model name: {exc.hint}") from None


Ref = Annotated[str, Field(min_length=1, max_length=200)]
ModelName = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_model_name)]
FolderName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
Priority = Annotated[int, Field(ge=PRIORITY[0], le=PRIORITY[1], description="higher runs first and may preempt lower")]


class _Spec(Strict):
    kind: ClassVar[str]
    role: ClassVar[str] = "operator"  # who may submit it

    def _resumed_alone(self, what: str, own: tuple[str, ...]) -> Self:
        """A resumed run or search keeps what it started with: refuse anything sent that it would ignore."""
        ignored = sorted(name for name in own if name in self.model_fields_set)
        if ignored:
            raise refusal(f"'resume' continues {what} as it started: {', '.join(repr(n) for n in ignored)} "
                          "cannot be sent with it")
        return self

    def dump(self) -> dict[str, Any]:
        """The parameters as given, for the jobs table and the control API: what parse() reads back."""
        return self.model_dump(mode="json", exclude_unset=True, exclude_none=True)

    def body(self, priority: int = 0) -> dict[str, Any]:
        """The control API's body that submits this job."""
        return {"kind": self.kind, "params": self.dump(), "priority": priority}


class _Training(_Spec):
    dataset: Ref = Field(description="the dataset: name, name:version or id (a pipeline imports into this name)")
    base: FolderName | None = Field(None, description=f"a model folder's name in {BASE_MODELS_DIR}; default: "
                                                      "train.base_model, or train.image_base_model for images")
    params: TrainParams = Field(TrainParams(), description="training hyperparameters; unnamed ones keep their default")
    device: Literal["cpu", "cuda"] | None = Field(None, description="default: the best available")
    name: ModelName | None = Field(None, description="register the model under this name; default: the dataset's")

    def training_params(self) -> TrainParams:
        """The hyperparameters the run trains with."""
        return self.params


class _Burst(_Spec):
    burst: bool = Field(False, description="train on the configured Ray cluster, if the dataset's residency allows")
    fallback: bool | None = Field(None, description="train here if the burst fails; default: burst.fallback_local")


class _Optimizing(_Spec):
    int8: bool = Field(OptimizeOptions.int8, description="also quantise to INT8 under the accuracy guard")
    distill: bool = Field(False, description="also distil a student, sized for this CPU unless distill_layers or "
                                             "distill_width set its shape (either one alone asks for a student too)")
    distill_layers: int | None = Field(None, ge=1, le=48, description="the student keeps K layers spread over the "
                                       "teacher's depth (default: half of them)")
    distill_width: int | None = Field(None, ge=1, le=65536, description="the student keeps the N most used units of "
                                      "each feed-forward block (default: all of them; sized for this CPU when the "
                                      "whole shape is left open)")
    max_accuracy_drop: float = Field(OptimizeOptions.max_accuracy_drop, ge=0, le=100,
                                     description="accuracy points a faster variant may lose against FP32")

    def optimize_options(self) -> OptimizeOptions:
        return OptimizeOptions(int8=self.int8, distill=self.distill, distill_layers=self.distill_layers,
                               distill_width=self.distill_width, max_accuracy_drop=self.max_accuracy_drop)


Deploy = Literal["auto", "now", "canary", "never"]


class _Deploying(_Spec):
    canary_percent: float | None = Field(None, gt=0, le=100, description="the canary's share of traffic; default: the "
                                                                         "model's autopilot canary_percent")
    deploy: Deploy = Field("auto", description="auto: production at once when the model serves nothing yet, else a "
                                               "canary unless it is clearly worse than production on validation "
                                               "data neither trained on, then it waits; now: production at once; "
                                               "canary: a canary at once; never: it waits for a person")

    @field_validator("deploy", mode="before")
    @classmethod
    def _from_yes_or_no(cls, given: Any, info: ValidationInfo) -> Any:
        """An older client's (and an older job's) true or false: production or a canary as canary_percent said."""
        if isinstance(given, bool):
            return ("canary" if info.data.get("canary_percent") else "now") if given else "never"
        return given


class TrainJob(_Burst, _Training):
    """Fine-tune a base model on a dataset and register the result, or continue an interrupted run."""

    kind: ClassVar[str] = "train"
    noun: ClassVar[str] = "a train job"

    dataset: Ref | None = Field(None, description="the dataset: name, name:version or id (not with 'resume')")
    resume: Ref | None = Field(None, description="an interrupted run's id: continue it from its last checkpoint, "
                                                 "with its own dataset, base and hyperparameters")

    @model_validator(mode="after")
    def _new_or_resumed(self) -> Self:
        if (self.dataset is None) == (self.resume is None):
            raise refusal("send 'dataset' for a new run, or 'resume' with an interrupted run's id")
        if self.resume is None:
            return self
        return self._resumed_alone("a run", ("dataset", "base", "params", "device", "burst", "fallback"))


class OptimizeJob(_Optimizing):
    """Export a registered model to OpenVINO, quantise and distil it under the accuracy guard."""

    kind: ClassVar[str] = "optimize"
    noun: ClassVar[str] = "an optimize job"

    version: Ref = Field(description="the model to optimise: name, name:version or name@alias")
    calibration_size: int = Field(OptimizeOptions.calibration_size, ge=1, le=100_000,
                                  description="training texts that calibrate INT8")
    metric: Metric = Field(OptimizeOptions.metric, description="the validation metric the guard compares")
    seed: int = Field(OptimizeOptions.seed, ge=0, le=2**32 - 1)
    max_minutes: float | None = Field(None, gt=0, le=WEEK_S / 60, description="the whole optimisation's time limit: "
                                      "a student learns for fewer epochs where its planned ones would pass it")

    def optimize_options(self) -> OptimizeOptions:
        return replace(super().optimize_options(), calibration_size=self.calibration_size, metric=self.metric,
                       seed=self.seed, within_s=None if self.max_minutes is None else self.max_minutes * 60)


class ExportJob(_Spec):
    """Write a registered model as a signed archive in an open format (registry/exchange.py); admin only. The
    archive waits, encrypted in the store, for its one download (GET /v1/exports/{job_id})."""

    kind: ClassVar[str] = "export"
    noun: ClassVar[str] = "an export job"
    role: ClassVar[str] = "admin"

    version: Ref = Field(description="the model to export: name, name:version or name@alias")
    format: Literal["onnx", "openvino", "hf"] = Field(description="onnx; openvino: the IR the version serves; hf: a "
                                                                  "Hugging Face directory")
    protection: Literal["passphrase", "recipient", "plaintext"] = Field(
        description="how the archive will leave the box, encrypted by the client that downloads it: under a "
                    "passphrase, to an age recipient, or in plaintext; on the audit record")


class PipelineJob(_Deploying, _Optimizing, _Burst, _Training):
    """Import (or extend with feedback), fine-tune, optimise and deploy."""

    kind: ClassVar[str] = "pipeline"
    noun: ClassVar[str] = "a pipeline job"

    source: FolderName | None = Field(None, description=f"a file (or image folder) in {IMPORT_DIR}, by its name "
                                                        "there: imported as the next version of 'dataset'")
    task: Literal["text-classification", "image-classification"] = datasets.TEXT
    residency: Literal["local-only", "burst-allowed"] = Field(datasets.LOCAL_ONLY,
                                                             description="of the imported version")
    retrain: ModelName | None = Field(None, description="a served model whose new feedback extends 'dataset' first")

    @model_validator(mode="after")
    def _one_origin(self) -> Self:
        if self.source is not None and self.retrain is not None:
            raise refusal("'retrain' extends 'dataset' with a served model's feedback and takes no 'source'; "
                          "send one of them")
        return self

    @property
    def student_share_s(self) -> float | None:
        """params.max_minutes bounds the whole job: where a student is distilled, it learns in the second half
        (as a tune job's does), the training has the first."""
        if self.params.max_minutes is None or not super().optimize_options().distills:
            return None
        return self.params.max_minutes * 60 / 2

    def training_params(self, optimising_s: float = 0.0) -> TrainParams:
        """The training's share of params.max_minutes: the first half where a student learns in the second, else
        what the optimisation after it leaves (optimising_s, as pipeline.Pace expects it), at least half."""
        if self.params.max_minutes is None:
            return self.params
        limit_s = self.params.max_minutes * 60
        share_s = self.student_share_s or pipeline.share_before(limit_s, optimising_s)
        return self.params.changed(max_minutes=share_s / 60)

    def optimize_options(self) -> OptimizeOptions:
        return replace(super().optimize_options(), within_s=self.student_share_s)


class TuneJob(_Deploying, _Optimizing, _Training):
    """Search hyperparameters within a budget, or continue a stopped search; the best trial is registered and
    optimised."""

    kind: ClassVar[str] = "tune"
    noun: ClassVar[str] = "a tune job"

    dataset: Ref | None = Field(None, description="the dataset: name, name:version or id (not with 'resume')")
    budget_s: float | None = Field(None, gt=0, le=WEEK_S, description="wall-clock seconds for the whole job: the "
                                   "search, and the optimisation after it (the longest it takes at this box's pace), "
                                   "or where a student is distilled too, half for the search and half for the student "
                                   "(not with 'resume')")
    resume: Ref | None = Field(None, description="a stopped search's id: continue it within what is left of its "
                                                 "budget, on its own dataset and space")
    metric: Metric = Field("macro_f1", description="the validation metric to maximise (and to guard)")
    space: dict[str, Any] = Field(default_factory=dict, description="narrows the default space: parameter -> "
                                                                    '{"low", "high", "log"}, choices, or one value')
    sampler: Literal["tpe", "random"] = "tpe"

    @field_validator("space")
    @classmethod
    def _searchable(cls, narrowing: dict[str, Any]) -> dict[str, Any]:
        try:
            return {name: space.check(name, entry, "space") for name, entry in narrowing.items()}
        except ApplianceError as exc:
            raise refusal(exc.message.removeprefix("space: ") + (f" ({exc.hint})" if exc.hint else "")) from None

    @model_validator(mode="after")
    def _new_or_resumed(self) -> Self:
        if self.resume is not None:
            return self._resumed_alone("a search", ("dataset", "budget_s", "base", "params", "device", "metric",
                                                     "space", "sampler"))
        if self.dataset is None or self.budget_s is None:
            raise refusal("send 'dataset' and 'budget_s' for a new search, or 'resume' with a stopped search's id")
        return self

    def optimize_options(self) -> OptimizeOptions:
        return replace(super().optimize_options(), metric=self.metric)


Spec = TrainJob | OptimizeJob | PipelineJob | TuneJob | ExportJob
SPECS: dict[str, type[Spec]] = {spec.kind: spec for spec in (TrainJob, OptimizeJob, PipelineJob, TuneJob, ExportJob)}
KINDS = tuple(SPECS)


def parse(kind: str, values: Any) -> Spec:
    """A job's parameters, as a client or the jobs table gives them; JobError naming what is wrong."""
    if kind not in SPECS:
        raise JobError(f"unknown job kind {shown(kind)}", hint=f"the kinds are: {', '.join(KINDS)}")
    return SPECS[kind].parse(values)


class _Submission(Strict):
    noun: ClassVar[str] = "a job request"


_REQUESTS = tuple(create_model(f"{spec.__name__}Request", __base__=_Submission, __doc__=spec.__doc__,
                               kind=(Literal[spec.kind], ...), params=(spec, ...), priority=(Priority, 0))
                  for spec in SPECS.values())


class JobRequest(RootModel[Annotated[Union[_REQUESTS], Field(discriminator="kind")]]):  # noqa: UP007
    """The control API's job body: {"kind", "params", "priority"}, each kind with its own params."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="wrap")
    @classmethod
    def _untagged(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """Refusals located as the client wrote them: 'params.dataset', not under the kind's own model."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise ValidationError.from_exception_data(cls.__name__, [_untag(error) for error in exc.errors()]) \
                from None

    @property
    def spec(self) -> Spec:
        return self.root.params

    @property
    def priority(self) -> int:
        return self.root.priority


def _untag(error: Any) -> InitErrorDetails:
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        given = error["ctx"].get("tag") if error["type"] == "union_tag_invalid" else None
        message = (f"{shown(given)} is not a job kind" if given is not None else "missing") + \
            f"; the kinds are {', '.join(KINDS)}"
        return InitErrorDetails(type=refusal(message), loc=("kind",), input=given)
    loc = error["loc"][1:] if error["loc"] and error["loc"][0] in KINDS else error["loc"]
    message = error["msg"] if error["type"] == EXPLAINED else \
        f"{shown(error['input'])} is not a job request: an object of kind, params and priority"
    return InitErrorDetails(type=refusal(message), loc=loc, input=error["input"])


def confine(spec: Spec, store: Store) -> None:
    """Refuse a source or base that does not name a plain file or folder inside its folder (reading none of it),
    and a run or search to resume that the daemon may not continue."""
    settings = store.settings
    if isinstance(spec, TrainJob | TuneJob) and spec.resume is not None:
        resumed(store, spec, confined=True)
    if isinstance(spec, PipelineJob) and spec.source is not None:
        imports = Folder(settings.daemon.import_dir, IMPORT_DIR)
        if spec.task == datasets.IMAGE:
            _folder(imports, spec.source, "source")
        else:
            try:
                imports.open_file(spec.source).close()
            except ConfinementError as exc:
                raise ConfinementError(f"source: {exc.message}", hint=exc.hint) from None
    if not isinstance(spec, OptimizeJob | ExportJob):
        base_dir(spec.base, settings)


def resumed(store: Store, spec: TrainJob | TuneJob, *, confined: bool) -> str:
    """The id of the run (train) or search (tune) that spec.resume names, which must be unfinished and, for a
    daemon's job (confined), from a base model the daemon would start one from; JobError otherwise."""
    if isinstance(spec, TrainJob):
        started, what, show = runs.get(store, spec.resume or ""), "run", "appliance runs show"
    else:
        started, what, show = studies.get(store, spec.resume or ""), "search", "appliance tune show"
    if started.status == "finished":
        raise JobError(f"{what} {started.id} has finished: there is nothing to resume",
                       hint=f"'{show} {started.id}' shows it")
    if confined:
        base_name(Path(started.base_model), store.settings)  # JobError for a folder the daemon does not load
    return started.id


def base_dir(base: str | None, settings: Settings, task: str = datasets.TEXT) -> Path:
    """The base model folder a job names: when it names none, train.base_model (text) or train.image_base_model
    (images), else that folder in train.base_models_dir, checked to be one (not a link) now."""
    if base is None:
        return settings.image_base_model if task == datasets.IMAGE else settings.base_model
    return _folder(Folder(settings.base_models_dir, BASE_MODELS_DIR), base, "base")


def base_name(path: Path, settings: Settings) -> str | None:
    """What a job names for the base model folder at path: nothing for train.base_model or train.image_base_model,
    its name when it lies directly in train.base_models_dir; JobError for any other folder, which the daemon does
    not load."""
    folder = path.resolve()
    if folder in (settings.base_model.resolve(), settings.image_base_model.resolve()):
        return None
    if settings.base_models_dir is not None and folder.parent == settings.base_models_dir.resolve():
        return folder.name
    where = settings.base_models_dir or "not configured"
    raise JobError(f"the daemon loads base models only from {BASE_MODELS_DIR} ({where}), and {path} is not there",
                   hint=f"copy the model folder into {BASE_MODELS_DIR}, or stop the daemon ('appliance stop') to "
                        "train from any folder")


def _folder(folder: Folder, name: str, parameter: str) -> Path:
    """The folder `name` inside folder, which must be one there now."""
    if folder.root is None:
        raise ConfinementError(f"{parameter}: no {folder.setting} is configured, so a job cannot name a folder there",
                               hint=f"have root set {folder.setting} and put the folder there"
                                    + ("; leave 'base' out for train.base_model" if parameter == "base" else ""))
    if not folder.is_folder(name):
        raise ConfinementError(f"{parameter}: there is no folder {shown(name)} in {folder.setting}",
                               hint="name a folder root put there, relative to it; links and '..' are refused")
    return folder.root / name
