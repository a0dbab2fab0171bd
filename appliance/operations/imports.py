"""Models trained elsewhere become registry versions, checked and measured on this appliance's data first.

What `appliance models import` takes, a folder or one file (of a folder, the top level is read; hidden files and
subfolders are not):

    hf        config.json and model.safetensors (or its shards) with the tokenizer's files: a Hugging Face
              sequence classifier. Pickled weights (pytorch_model.bin, *.pt, *.pth, *.ckpt, *.pkl) are refused
              and never read: loading a pickle runs whatever code it holds.
    onnx      one *.onnx graph holding its weights, with config.json and the tokenizer's files
    openvino  one *.xml IR and its *.bin (as optimum-intel or ovc write them), config.json, the tokenizer's files
    archive   an appliance's export (`models export`: a tar; the CLI decrypts an encrypted one first). Its
              signature and every hash must verify; its card (labels, base model, dataset hash, metrics, where
              it trained) is kept as the import's lineage.

A folder sent through the control API comes as an uncompressed tar (sources.tar_stream), an archive as itself.
The labels, in logit order, are config.json's id2label, the card's, or the ones given. A text classifier's graph
must take int64 input_ids and attention_mask (token_type_ids where it has them) and give one [batch, labels]
output. An image classifier (for an image dataset) comes as ONNX or OpenVINO IR with one float input of
[batch, 3, size, size] (renamed pixel_values, its batch made free) and says how it reads a photo: the card's
preprocessing, or the Hugging Face image processor's preprocessor_config.json (image_mean, image_std, and
crop_size or size: the square the model sees, taken from the centre as the appliance's own models do).

The model is measured on the validation split of a dataset here, whose labels it must cover: its logits must
be finite and of the right shape, the accuracy it reaches is the version's (the baseline of a later optimise's
guard), and the drift reference comes from the same data. Nothing is stored until every check has passed; a
refusal is audited like the import. Then the import is one finished run whose `trained_on` reads "imported
from sha256:...": the archive's SHA-256 (which the exporting appliance's audit record names), or for a folder
the SHA-256 of its files' names and SHA-256s. Its version's chosen variant is the FP32 OpenVINO IR, servable
at once; a Hugging Face import keeps its torch bundle too, so it can also be distilled and exported as hf.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, get_args

import numpy as np
import psutil

from appliance import inference, pixels, registry, words
from appliance.core import archive, hardware
from appliance.core.errors import ArtifactError, ConfinementError, DatasetError, RegistryError
from appliance.data import datasets, sources
from appliance.operations import pipeline
from appliance.operations.pipeline import Progress
from appliance.registry import exchange
from appliance.store import Store, audit, blobs
from appliance.train import runs
from appliance.train.tasks import TOKENIZER_FILES

ACTION = "model.import"
PICKLED = (".pt", ".pth", ".ckpt", ".pkl", ".pickle")  # torch.save's formats (and pytorch_model.bin, see pickled)
MAX_LENGTH = 512  # tokens, where neither the tokenizer nor the config says less
MEMORY_SHARE = 6  # an import holds the weights about five times at once: files, model, IR, compiled, blob
HUB_LABEL = re.compile(r"LABEL_\d+")  # what transformers names labels nobody named
Lend = Callable[[], AbstractContextManager[Store]]  # the store, borrowed for a moment (a daemon's is shared)


@dataclass(frozen=True)
class Incoming:
    """A model's files as read, the format they are in, and the SHA-256 its lineage names."""

    files: dict[str, bytes]
    format: str
    sha256: str
    origin: str


@dataclass(frozen=True)
class Candidate:
    """An incoming model made ready to store: its FP32 IR, the files it is packed with (tokenizer, appliance.json),
    its torch bundle where it came with torch weights, and what its lineage records."""

    fp32: inference.Artifact
    files: dict[str, bytes]
    labels: list[str]
    torch_bundle: bytes | None
    base_model: str
    provenance: dict[str, Any]


def import_model(lend: Lend, source: sources.Source, *, name: str, dataset: str, labels: Sequence[str] = (),
                 public_key: str | None = None, task: str | None = None, progress: Progress | None = None,
                 actor: str | None = None) -> registry.ModelVersion:
    """Check the model at source, measure it on the dataset's validation split, and store it as the next version
    of `name`, a classifier of the dataset's task (`task`, when given, must be it); audited as model.import
    (refusals too). The store is borrowed (lend) only to read the dataset and to write the result, so a daemon
    serves other calls while the model is converted and measured."""
    report = progress or (lambda done, total, label: None)
    data = check_request(lend, source, name=name, dataset=dataset, task=task, actor=actor)
    details: dict[str, Any] = {"source": source.origin[:300], "dataset": dataset}
    try:
        with lend() as store:
            held = pipeline.held_out(datasets.load(store, data))
        report(0, 4, "read the model")
        incoming = read(source, memory_limit())
        details.update(format=incoming.format, sha256=incoming.sha256)
        report(1, 4, f"check the {incoming.format} model")
        candidate = prepare(incoming, list(labels), public_key, data.task)
        report(2, 4, f"measure it on {data.ref}")
        scores, logits = measure(candidate, held)
        fp32 = pipeline.servable_ir(candidate.fp32, candidate.files, pipeline.FP32, held, scores, logits)
        speed = inference.compare({pipeline.FP32: fp32.servable}, held.examples)
    except (RegistryError, DatasetError, ConfinementError, ArtifactError):
        with lend() as store, audit.operation(store, ACTION, name, actor=actor, **details):
            raise  # operation() writes the "failed" record
    report(3, 4, "store it encrypted")
    with lend() as store, audit.operation(store, ACTION, name, actor=actor, **details) as recorded:
        variants = [fp32.stored(store, speed[pipeline.FP32])]
        torch_blob = None if candidate.torch_bundle is None else blobs.put(store, candidate.torch_bundle)
        if torch_blob is not None:
            variants.append(registry.Variant(pipeline.TORCH, "torch-bundle", torch_blob,
                                             len(candidate.torch_bundle), scores))
        params = {"imported": {"format": incoming.format, "sha256": incoming.sha256, "origin": incoming.origin,
                               **candidate.provenance}}
        run_id = runs.imported(store, dataset_id=data.id, base_model=candidate.base_model, task=data.task,
                               params=params, trained_on=f"imported from sha256:{incoming.sha256}",
                               model_blob=torch_blob, metrics=scores)
        reason = (f"imported ({incoming.format}), not optimised yet: {scores['accuracy']:.3f} accuracy on"
                  f" {held.scored} of {data.ref}")
        version = registry.register(store, name, run_id=run_id, task=data.task, variants=variants,
                                    chosen=pipeline.FP32, reason=reason, actor=actor)
        recorded.update(version=version.ref, run=run_id, accuracy=scores["accuracy"])
    report(4, 4, f"imported as {version.ref}")
    return version


def check_request(lend: Lend, source: sources.Source, *, name: str, dataset: str, task: str | None = None,
                  actor: str | None = None) -> datasets.DatasetVersion:
    """The dataset a model named `name` is measured on, checked before any of the model is read (the daemon checks
    an upload's request before it receives the body); a refusal is audited as a refused import."""
    try:
        registry.check_name(name)
        with lend() as store:
            data = datasets.get(store, dataset)
        if task is not None and task != data.task:
            raise RegistryError(f"the model's task is given as {task}, and {data.ref}'s is {data.task}",
                                hint=f"measure it on a dataset for {task}")
    except (RegistryError, DatasetError):
        with lend() as store, audit.operation(store, ACTION, name, actor=actor, source=source.origin[:300],
                                              dataset=dataset):
            raise
    return data


def memory_limit() -> int:
    """The most bytes of model files this box can check in memory now."""
    return psutil.virtual_memory().available // MEMORY_SHARE


# -- reading -------------------------------------------------------------------------------


def read(source: sources.Source, limit: int) -> Incoming:
    """The model's files, bounded by limit bytes, and what format they are in."""
    if source.is_folder():
        files, pickles = _collect(source, limit)
        return Incoming(files, _format(files, pickles, source.name), _listing_sha256(files), source.origin)
    size = source.size()
    if size > limit:
        raise _too_large(size, limit, source.name)
    with source.open() as file:
        data = file.read(limit + 1)
    if data.startswith(exchange.AGE_MAGIC):
        raise RegistryError(f"{source.name} is an encrypted archive, which only its recipient can open",
                            hint="import it with the appliance command on this box: 'appliance models import"
                                 " ARCHIVE --identity FILE' (or its passphrase) decrypts it before sending")
    if len(data) > limit:
        raise _too_large(len(data), limit, source.name)
    try:
        files, pickles = _collect(sources.Upload(source.name, data, folder=True), limit)
    except DatasetError as exc:
        raise RegistryError(f"{source.name} is neither a model folder nor a whole export archive"
                            f" ({exc.message.split(': ', 1)[-1]})",
                            hint="give the folder the model was saved to, with its tokenizer's files, or an archive"
                                 " that 'appliance models export' wrote (copy one cut short again)") from None
    fmt = _format(files, pickles, source.name)
    return Incoming(files, fmt, hashlib.sha256(data).hexdigest() if fmt == "archive" else _listing_sha256(files),
                    source.origin)


def pickled(name: str, names: Iterable[str]) -> bool:
    """Whether a file holds pickled weights: torch.save's formats, or a .bin that is no OpenVINO IR's weights."""
    path = PurePosixPath(name)
    return path.suffix in PICKLED or (path.suffix == ".bin" and path.with_suffix(".xml").as_posix() not in names)


def _collect(source: sources.Source, limit: int) -> tuple[dict[str, bytes], list[str]]:
    """The top-level files (and an archive's model/ folder), read up to limit bytes in all; pickles are named,
    never read. The folder is walked twice: for names, then for content."""
    def wanted(entry: str) -> bool:
        return "/" not in entry or entry.startswith("model/")

    names = {file.entry for file in source.files() if wanted(file.entry)}
    files, pickles, total = {}, [], 0
    for file in source.files():
        if not wanted(file.entry) or file.entry not in names:
            continue
        if pickled(file.entry, names):
            pickles.append(file.entry)
            continue
        total += file.size
        if total > limit:
            raise _too_large(total, limit, source.name)
        files[file.entry] = file.read()
    return files, pickles


def _format(files: dict[str, bytes], pickles: list[str], shown: str) -> str:
    top = [name for name in files if "/" not in name]
    if {exchange.signed.MANIFEST, "card.json"} <= set(top):
        return "archive"
    if any(name.endswith(".safetensors") for name in top):
        return "hf"
    if any(name.endswith(".onnx") for name in top):
        return "onnx"
    if any(name.endswith(".xml") for name in top):
        return "openvino"
    if pickles:
        raise RegistryError(f"{shown}: its weights ({', '.join(sorted(pickles)[:3])}) are pickles, which run code"
                            " when loaded, so they are refused",
                            hint="save the model as safetensors (model.save_pretrained(folder,"
                                 " safe_serialization=True)), or export it to ONNX or OpenVINO")
    raise RegistryError(f"{shown}: no model found: neither *.safetensors, *.onnx, an OpenVINO *.xml nor an"
                        " appliance export archive", hint="give the folder the model was saved to, with its"
                                                          " tokenizer's files")


def _listing_sha256(files: dict[str, bytes]) -> str:
    listing = "".join(f"{name}\0{hashlib.sha256(data).hexdigest()}\n" for name, data in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def _too_large(size: int, limit: int, shown: str) -> RegistryError:
    return RegistryError(f"{shown}: the model's files take {hardware.format_bytes(size)}, more than this box can"
                         f" check in memory now ({hardware.format_bytes(limit)}, 1/{MEMORY_SHARE} of the RAM"
                         " available)", hint="import a smaller model, or free memory and try again")


# -- checking ------------------------------------------------------------------------------


def prepare(incoming: Incoming, labels: list[str], public_key: str | None = None,
            task: str = datasets.TEXT) -> Candidate:
    """The incoming files as a classifier of task this appliance can serve, or RegistryError saying what does not
    fit."""
    files, provenance, reading = incoming.files, {}, {}
    fmt, base_model = incoming.format, f"imported {incoming.format} model"
    if fmt == "archive":
        checked, card = exchange.check_files(files, public_key=public_key)
        files = {name.removeprefix("model/"): data for name, data in files.items() if name.startswith("model/")}
        fmt, card_labels, reading, base_model, licence = _card_fields(card, task)
        labels = labels or card_labels
        provenance = {"card": card, "licence": licence, "signed_by": checked.public_key,
                      "vouched_by": checked.trusted or "its own key only"}
    config = _json(files, "config.json") if "config.json" in files else {}
    labels = labels or _config_labels(config)
    if len(set(labels)) != len(labels) or not all(labels):
        raise RegistryError(f"the labels {', '.join(labels[:10])} repeat or leave one empty",
                            hint="give each of the model's outputs its own name, in logit order")
    if task == datasets.IMAGE:
        packed_files, fp32 = _image_model(files, fmt, labels, reading.get("preprocessing"))
        torch_bundle = None
    else:
        packed_files, fp32, torch_bundle = _text_model(files, fmt, labels, config, reading.get("max_length"),
                                                       reading.get("truncation", "head"))
    if "licence" not in provenance:
        provenance["licence"] = exchange.stated_licence(files.get("README.md", b"").decode(errors="replace")) or \
            "unknown: the model's card (README.md) states none"
    return Candidate(fp32, packed_files, labels, torch_bundle, base_model, provenance)


def _text_model(files: dict[str, bytes], fmt: str, labels: list[str], config: dict[str, Any],
                max_length: int | None, truncation: str) -> tuple[dict[str, bytes], inference.Artifact, bytes | None]:
    """A text classifier's files to pack (tokenizer, appliance.json), its FP32 IR, and its torch bundle where it
    came with torch weights."""
    if "tokenizer.json" not in files:
        raise RegistryError("the model comes without tokenizer.json, so its texts cannot be tokenized as it was"
                            " trained", hint="save the tokenizer beside it: tokenizer.save_pretrained(folder)")
    tokenizer_files = {name: files[name] for name in TOKENIZER_FILES if name in files}
    manifest = {"task": datasets.TEXT, "labels": labels, "max_length": max_length or _max_length(files, config),
                "truncation": truncation, "imported_from": fmt}
    try:
        words.Words.of(tokenizer_files, manifest)
    except Exception as exc:  # tokenizers raises its own Exception for any malformed file
        raise RegistryError(f"tokenizer.json is not a tokenizer the tokenizers library reads: {_said(exc)}",
                            hint="save it with a fast tokenizer: tokenizer.save_pretrained(folder)") from exc
    packed_files = tokenizer_files | {"appliance.json": json.dumps(manifest, indent=2).encode()}
    if fmt == "hf":
        bundle = _hf_bundle(files, config, labels) | packed_files
        return packed_files, _from_torch(bundle), archive.pack(sorted(bundle.items()))
    if fmt == "onnx":
        return packed_files, _checked_graph(_read_onnx(files), labels), None
    if fmt == "openvino":
        return packed_files, _checked_graph(_read_ir(files), labels), None
    raise RegistryError(f"the archive's model is in an unknown format {fmt!r}", hint="export it again")


def _image_model(files: dict[str, bytes], fmt: str, labels: list[str], preprocessing: dict[str, Any] | None
                 ) -> tuple[dict[str, bytes], inference.Artifact]:
    """An image classifier's appliance.json (labels, and how it reads a photo) and its FP32 IR."""
    if fmt not in ("onnx", "openvino"):
        raise RegistryError(f"an image classifier is imported as an ONNX graph or an OpenVINO IR, not as {fmt}",
                            hint="export it to ONNX (weights inside) with preprocessor_config.json beside it")
    reads = _pictures(preprocessing) if preprocessing else _preprocessor_config(files)
    model = _read_onnx(files) if fmt == "onnx" else _read_ir(files)
    manifest = {"task": datasets.IMAGE, "labels": labels, "image_size": reads.size, "mean": list(reads.mean),
                "std": list(reads.std), "imported_from": fmt}
    return {"appliance.json": json.dumps(manifest, indent=2).encode()}, _checked_image_graph(model, labels, reads.size)


def _preprocessor_config(files: dict[str, bytes]) -> pixels.Pictures:
    """How the model reads a photo, from a Hugging Face image processor's preprocessor_config.json."""
    hint = ("save the image processor beside it (processor.save_pretrained(folder)), or write preprocessor_config.json"
            ' with "image_mean", "image_std" (per RGB channel, pixels in 0..1) and "crop_size": {"height": S,'
            ' "width": S}')
    if "preprocessor_config.json" not in files:
        raise RegistryError("the image model comes without preprocessor_config.json, so how it reads a photo (size,"
                            " normalisation) is unknown", hint=hint)
    config = _json(files, "preprocessor_config.json")
    square = config.get("crop_size") or config.get("size") or {}
    side = square.get("height", square.get("shortest_edge")) if isinstance(square, dict) else square
    if isinstance(square, dict) and square.get("width", side) != side:
        raise RegistryError(f"preprocessor_config.json's model input is {square}, not square", hint=hint)
    return _pictures({"image_size": side, "mean": config.get("image_mean"), "std": config.get("image_std")}, hint)


def _pictures(given: dict[str, Any], hint: str = "export the model again from the appliance") -> pixels.Pictures:
    """The input size and normalisation a model says it takes, checked."""
    size, mean, std = given.get("image_size"), given.get("mean"), given.get("std")
    if not (isinstance(size, int) and 16 <= size <= 1024 and all(
            isinstance(values, list) and len(values) == 3 and all(isinstance(v, int | float) for v in values)
            for values in (mean, std)) and min(std) > 0):
        raise RegistryError("the model's preprocessing needs a square input of 16 to 1024 pixels and three means and"
                            " three positive standard deviations", hint=hint)
    return pixels.Pictures(size, tuple(map(float, mean)), tuple(map(float, std)))


def measure(candidate: Candidate, held: pipeline.HeldOut) -> tuple[dict[str, float], np.ndarray]:
    """Accuracy and macro-F1 on the validation split, once the model has shown it answers sanely, and the logits
    they came from."""
    missing = sorted(set(held.labels) - set(candidate.labels))
    if missing:
        raise RegistryError(f"the model's labels ({', '.join(candidate.labels[:10])}) lack the dataset's "
                            f"{', '.join(missing[:10])}", hint="measure it on a dataset with the labels it"
                            " predicts, or give its labels in logit order (--labels)")
    servable = inference.load_ir(inference.pack_ir(candidate.fp32, candidate.files, pipeline.FP32))
    try:
        logits = inference.predict(servable.compiled, servable.reader, held.examples)
    except RuntimeError as exc:  # OpenVINO's word for a graph that cannot run on these inputs
        raise RegistryError(f"the model fails on the dataset's examples: {_said(exc)}",
                            hint="check that it is the classifier its files say it is, reading examples as they"
                                 " say (tokenizer, or preprocessing)") from exc
    if logits.shape != (len(held.examples), len(candidate.labels)) or not np.isfinite(logits).all():
        raise RegistryError(f"the model gave {'non-finite' if logits.shape[1:] == (len(candidate.labels),) else 'mis-shaped'}"
                            f" logits (shape {list(logits.shape)}) for {len(held.examples)} examples",
                            hint="check that it is the classifier its files say it is")
    index = {label: i for i, label in enumerate(candidate.labels)}
    from appliance.core import scoring

    return scoring.metrics(logits.argmax(axis=1).tolist(), [index[label] for label in held.labels],
                           len(candidate.labels)), logits


def _config_labels(config: dict[str, Any]) -> list[str]:
    named = config.get("id2label") or {}
    try:
        labels = [str(named[key]) for key in sorted(named, key=int)]
    except (ValueError, TypeError):
        labels = []
    if not labels or all(HUB_LABEL.fullmatch(label) for label in labels):
        raise RegistryError("the model does not name its labels (config.json's id2label is missing or LABEL_0...)",
                            hint="give them in logit order: --labels billing,shipping,...")
    return labels


def _max_length(files: dict[str, bytes], config: dict[str, Any]) -> int:
    tokenizer_config = _json(files, "tokenizer_config.json") if "tokenizer_config.json" in files else {}
    limits = [value for value in (tokenizer_config.get("model_max_length"), config.get("max_position_embeddings"))
              if isinstance(value, int) and 0 < value]
    return min([MAX_LENGTH, *limits])


def _hf_bundle(files: dict[str, bytes], config: dict[str, Any], labels: list[str]) -> dict[str, bytes]:
    """config.json (with the labels) and one model.safetensors, shards joined."""
    from safetensors import SafetensorError
    from safetensors.numpy import load, save

    if not config:
        raise RegistryError("the Hugging Face model has no config.json", hint="save it with model.save_pretrained")
    shards = sorted(name for name in files if name.endswith(".safetensors"))
    try:
        weights = files[shards[0]] if len(shards) == 1 else save({k: v for name in shards
                                                                  for k, v in load(files[name]).items()})
    except SafetensorError as exc:
        raise RegistryError(f"the weights are not readable safetensors: {exc}",
                            hint="the file may be cut short: copy it again") from exc
    named = {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}
    config = {key: value for key, value in config.items() if key != "auto_map"}  # code of its own: never run
    return {"config.json": json.dumps(config | named).encode(), "model.safetensors": weights}


def _from_torch(bundle: dict[str, bytes]) -> inference.Artifact:
    """The Hugging Face model's FP32 IR, once its config has been shown to describe exactly the weights given: a
    config is built first without memory (torch's meta device), so one claiming a vast model costs nothing."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForSequenceClassification

    from appliance import optimize

    hint = "import a model saved by AutoModelForSequenceClassification.save_pretrained"
    try:
        config_dict = json.loads(bundle["config.json"])
        with torch.device("meta"):
            shell = AutoModelForSequenceClassification.from_config(
                CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict))
        expected = {name: list(tensor.shape) for name, tensor in shell.state_dict().items()}
    except Exception as exc:  # transformers raises many types for a config it cannot build
        raise RegistryError(f"config.json does not describe a sequence classifier transformers builds: {_said(exc)}",
                            hint=hint) from exc
    given = _safetensors_shapes(bundle["model.safetensors"])
    differ = sorted(name for name in expected.keys() | given.keys() if expected.get(name) != given.get(name))
    if differ:
        raise RegistryError(f"the weights do not fit config.json: {len(differ)} tensors differ or are missing, such as"
                            f" {', '.join(differ[:3])}", hint=hint + ", with the labels it was trained with")
    try:
        fp32, _tokenizer, _manifest = optimize.export_bundle(bundle)
    except Exception as exc:  # loading and converting raise many types; all mean the model cannot be used
        raise RegistryError(f"the Hugging Face model cannot be loaded as a sequence classifier: {_said(exc)}",
                            hint=hint) from exc
    return fp32


def _safetensors_shapes(weights: bytes) -> dict[str, list[int]]:
    """Each tensor's shape from a safetensors header (8 bytes of length, then JSON), reading no tensor."""
    try:
        size = int.from_bytes(weights[:8], "little")
        header = json.loads(weights[8:8 + size])
        return {name: list(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RegistryError("the weights are not a readable safetensors file",
                            hint="the file may be cut short: copy it again") from exc


def _card_fields(card: dict[str, Any], task: str) -> tuple[str, list[str], dict[str, Any], str, str]:
    """An archive card's format, labels, how the model reads an example (max_length, or an image model's
    preprocessing), base model and licence, checked: a signature proves only that the card is as its signer wrote
    it."""
    reading = "preprocessing" if task == datasets.IMAGE else "max_length"
    if card.get("task", datasets.TEXT) != task:
        raise RegistryError(f"the archive's model is for {card.get('task')}, and the dataset is for {task}",
                            hint=f"measure it on a dataset for {card.get('task')}")
    try:
        fields = (card["format"], card["labels"], card[reading], card["base_model"]["path"],
                  card["base_model"]["licence"])
    except (KeyError, TypeError) as exc:
        raise RegistryError(f"the archive's card lacks {exc}", hint="export the model again from the appliance"
                            ) from None
    fmt, labels, how, base_model, licence = fields
    if task == datasets.IMAGE:
        _pictures(how if isinstance(how, dict) else {})
    if not (isinstance(labels, list) and all(isinstance(label, str) for label in labels)
            and (task == datasets.IMAGE or (isinstance(how, int) and 0 < how <= 8192))
            and all(isinstance(text, str) for text in (fmt, base_model, licence))):
        raise RegistryError(f"the archive's card names its format, labels, {reading} or base model wrongly",
                            hint="export the model again from the appliance")
    truncation = card.get("truncation", "head")  # an archive exported before the choice existed: head
    if task != datasets.IMAGE and truncation not in get_args(datasets.Truncation):
        raise RegistryError("the archive's card names a truncation that is none of"  # its words are not echoed
                            f" {', '.join(get_args(datasets.Truncation))}", hint="export the model again from the appliance")
    return fmt, labels, {reading: how, "truncation": truncation}, base_model, licence


def _read_onnx(files: dict[str, bytes]) -> Any:
    graphs = [name for name in files if name.endswith(".onnx")]
    if len(graphs) != 1:
        raise RegistryError(f"expected one ONNX graph, found {len(graphs)}: {', '.join(sorted(graphs)[:5])}",
                            hint="import a folder with the classifier's model.onnx only")
    try:
        return inference.read_onnx(files[graphs[0]])
    except ArtifactError as exc:
        raise RegistryError(f"{graphs[0]}: {exc.message}", hint="save the graph with its weights inside (onnx.save("
                            "model, path, save_as_external_data=False))") from exc
    except RuntimeError as exc:
        raise RegistryError(f"{graphs[0]} is not a readable ONNX graph: {_said(exc)}",
                            hint="it may be cut short: copy it again") from exc


def _read_ir(files: dict[str, bytes]) -> Any:
    graphs = [name for name in files if name.endswith(".xml")]
    if len(graphs) != 1:
        raise RegistryError(f"expected one OpenVINO IR (*.xml), found {len(graphs)}",
                            hint="import a folder with the classifier's IR only")
    weights = str(PurePosixPath(graphs[0]).with_suffix(".bin"))
    if weights not in files:
        raise RegistryError(f"{graphs[0]} comes without its weights {weights}", hint="copy both files")
    try:
        return inference.read_openvino(inference.Artifact(files[graphs[0]], files[weights]))
    except ArtifactError as exc:
        raise RegistryError(f"{graphs[0]}: {exc.message}", hint="give the .xml and .bin that ovc or optimum-intel"
                            " wrote") from exc
    except RuntimeError as exc:
        raise RegistryError(f"{graphs[0]} is not a readable OpenVINO IR: {_said(exc)}",
                            hint="it may be cut short: copy it again") from exc


def _checked_graph(model: Any, labels: list[str]) -> inference.Artifact:
    """The graph as this appliance serves it (output named logits), if its inputs and output fit the task."""
    names = [port.get_any_name() for port in model.inputs]
    unexpected = [name for name in names if name not in inference.INPUTS]
    if unexpected or not {"input_ids", "attention_mask"} <= set(names):
        raise RegistryError(f"the graph takes {', '.join(names)}; a text classifier here takes input_ids and"
                            " attention_mask (and token_type_ids)", hint="export the classifier with the"
                            " tokenizer's inputs, named as Hugging Face names them")
    for port in model.inputs:
        if port.get_partial_shape().rank.get_length() != 2 or not port.get_element_type().is_integral():
            raise RegistryError(f"the graph's input {port.get_any_name()} is not an integer [batch, sequence]"
                                " tensor", hint="export it with dynamic batch and sequence axes")
    return _with_logits(model, labels)


def _checked_image_graph(model: Any, labels: list[str], size: int) -> inference.Artifact:
    """The graph as this appliance serves an image model (input pixel_values of any batch, output logits), if it
    takes one float [batch, 3, size, size] input and gives the labels' logits."""
    import openvino as ov

    hint = f"export the classifier with one input, its pixels as [batch, 3, {size}, {size}] float32"
    if len(model.inputs) != 1:
        raise RegistryError(f"the graph takes {len(model.inputs)} inputs; an image classifier takes one, its pixels",
                            hint=hint)
    port = model.inputs[0]
    shape = port.get_partial_shape()
    fits = shape.rank.is_static and shape.rank.get_length() == 4 and all(
        dim.is_dynamic or dim.get_length() == want for dim, want in zip(shape, (None, 3, size, size)) if want)
    if not fits or not port.get_element_type().is_real():
        raise RegistryError(f"the graph's input {port.get_any_name()} is {port.get_element_type()} {shape}, not"
                            f" float [batch, 3, {size}, {size}] as its preprocessing says", hint=hint)
    try:
        model.reshape({port: ov.PartialShape([-1, 3, size, size])})  # a graph exported for one batch size takes any
    except RuntimeError as exc:
        raise RegistryError(f"the graph cannot take batches of any size: {_said(exc)}",
                            hint=hint + ", its batch axis dynamic") from exc
    port.get_tensor().set_names({pixels.INPUT})
    return _with_logits(model, labels)


def _with_logits(model: Any, labels: list[str]) -> inference.Artifact:
    """The graph, its one output of a [batch, labels] row of logits named logits, serialised."""
    from appliance import optimize

    outputs = [port for port in model.outputs if "logits" in port.get_names()] or list(model.outputs)
    shape = outputs[0].get_partial_shape()
    if len(outputs) != 1 or shape.rank.is_dynamic or shape.rank.get_length() != 2 or (
            shape[1].is_static and shape[1].get_length() != len(labels)):
        raise RegistryError(f"the graph's output {outputs[0].get_any_name()} is {shape}, not one [batch,"
                            f" {len(labels)}] row of logits for the {len(labels)} labels",
                            hint="give the labels in logit order (--labels), or export the classifier's logits")
    outputs[0].get_tensor().set_names({"logits"})
    return optimize.serialize(model)


def _json(files: dict[str, bytes], name: str) -> dict[str, Any]:
    try:
        found = json.loads(files[name])
    except ValueError as exc:
        raise RegistryError(f"{name} is not JSON: {exc}", hint="copy it again from where the model was saved") from exc
    if not isinstance(found, dict):
        raise RegistryError(f"{name} is not a JSON object", hint="copy it again from where the model was saved")
    return found


def _said(exc: Exception) -> str:
    """A library's error, first line only and bounded: it names no path of ours, only the model's parts."""
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
