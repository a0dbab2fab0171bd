"""Models out of the box in open formats: one signed archive that runs without the appliance.

An export archive is a plain tar:

    model/              the model, in the format asked for:
                          onnx      model.onnx (inputs input_ids, attention_mask[, token_type_ids], or an image
                                    model's pixel_values; output logits)
                          openvino  model.xml + model.bin, the IR of the variant the version serves (INT8 where
                                    the guard chose it), same inputs and output
                          hf        config.json + model.safetensors, a Hugging Face sequence classifier (text only);
                                    a mean-pooled one as a sentence-transformers model whose embedding is the
                                    logits (the encoder, 1_Pooling/ and the head in 2_Dense/)
                        and a text model's tokenizer files (tokenizer.json, ...) beside it
    card.json           the model card: task, labels in logit order, inputs, outputs, max_length (an image model's
                        preprocessing instead), base model and its licence, dataset version and its SHA-256,
                        validation metrics, the guard's decision
    README.txt          how to check it and load it
    manifest.json       every file's SHA-256, signed by this appliance's Ed25519 key (store/signed.py)
    manifest.sig

`protect` encrypts an archive with age (age-encryption.org/v1: to an X25519 recipient, or under a passphrase),
so the recipient opens it with the `age` tool or any age library; `verify` opens one (decrypting it first where
it is encrypted) and checks every file against the signed manifest, offline. The export itself is audited where
it is made (`model.export`: who, which version, format, the archive's SHA-256, how it leaves).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from appliance import inference, pixels, registry, words
from appliance.core import archive, clock, files
from appliance.core.errors import ApplianceError, ArtifactError, RegistryError
from appliance.data import datasets
from appliance.store import Store, anchor, audit, blobs, keys, signed
from appliance.train import runs

FORMAT = "appliance-model-export/1"
Format = Literal["onnx", "openvino", "hf"]
FORMATS: tuple[Format, ...] = ("onnx", "openvino", "hf")
Protection = Literal["passphrase", "recipient", "plaintext"]
AGE_MAGIC = b"age-encryption.org/v1\n"
MIN_PASSPHRASE = keys.MIN_PASSPHRASE  # characters; age stretches it with scrypt
TORCH = "torch"  # the variant every version holds: the trained bundle (operations.pipeline.TORCH)
FP32 = "fp32"  # an imported version's own IR, where it came without torch weights (operations.imports)
FOREIGN_FILES = ("appliance.json",)  # the bundle's own manifest: its facts go to the card instead
MODEL_FILES = ("config.json", "model.safetensors", "model.xml", "model.bin")  # a bundle's or IR's, not the tokenizer's

README = """Model {ref} ({task}), exported {exported_at} by appliance store {store_id} as {format}.

model/         the model{and_tokenizer}
card.json      labels (in the order of the model's logits), inputs and outputs, {reading},
               base model and licence, dataset version and SHA-256, validation metrics
manifest.json  the SHA-256 of every file here, and the signing public key
manifest.sig   the Ed25519 signature (hex) over the exact bytes of manifest.json

Check it (offline): appliance models verify ARCHIVE [--public-key HEX]
or by hand: compare each file's SHA-256 with manifest.json, then verify manifest.sig over
manifest.json with the Ed25519 public key in it. That key's SHA-256 is
  {fingerprint}
compare it with a key or an audit checkpoint you got from the appliance separately.

Predict: {predict};
the softmax of `logits` gives every label's probability, label i being card.json's labels[i].
The appliance's README shows it in ten lines for onnxruntime and for OpenVINO.
"""
READING = {  # the README's words for how a text model and an image model read their examples
    False: {"and_tokenizer": " and its tokenizer's files", "reading": "max_length",
            "predict": "tokenize with tokenizer.json (the `tokenizers` library; a text longer than max_length\n"
                       "tokens keeps card.json's kept_tokens: its first `head` and last `tail` tokens between the\n"
                       "special ones; pad with the tokenizer's pad token), feed input_ids and attention_mask (and\n"
                       "token_type_ids where the model takes them) as int64"},
    True: {"and_tokenizer": "", "reading": "preprocessing",
           "predict": "prepare each image as card.json's preprocessing says (the centre square,\n"
                      "resized, normalised, channels first), feed the batch as pixel_values (float32)"},
}


@dataclass(frozen=True)
class Exported:
    """A signed export archive (plaintext: `protect` encrypts it) and what the audit record names."""

    ref: str
    format: Format
    archive: bytes
    sha256: str


def export(store: Store, ref: str, fmt: Format, protection: Protection, actor: str | None = None) -> Exported:
    """The version as a signed archive in an open format; audited as `model.export` with the protection it will
    leave under (the caller encrypts it as declared)."""
    version = registry.get(store, ref)
    with audit.operation(store, "model.export", version.ref, actor=actor, format=fmt,
                         protection=protection) as details:
        source = version.variants.get(TORCH) or version.variants[FP32]  # an import may come without torch weights
        bundle = archive.unpack(blobs.read(store, source.blob_id))
        files, variant = _model_files(store, version, bundle, fmt)
        card = model_card(store, version, bundle, fmt, variant, files)
        contents = {f"model/{name}": data for name, data in sorted(files.items())}
        contents["card.json"] = json.dumps(card, indent=2, sort_keys=True).encode() + b"\n"
        public_key = anchor.public_key(store)
        contents["README.txt"] = README.format(ref=version.ref, task=version.task, exported_at=card["exported_at"],
                                               store_id=store.store_id, format=fmt,
                                               fingerprint=anchor.fingerprint(public_key),
                                               **READING[version.task == datasets.IMAGE]).encode()
        contents |= signed.sign(store, contents, format=FORMAT, model=version.ref, exported_at=card["exported_at"])
        packed = archive.pack(sorted(contents.items()))  # 0600: unpacked, the weights are the user's alone
        digest = hashlib.sha256(packed).hexdigest()
        details.update(sha256=digest, bytes=len(packed), variant=variant)
    return Exported(version.ref, fmt, packed, digest)


def protect(packed: bytes, *, recipient: str | None = None, passphrase: str | None = None) -> bytes:
    """The archive encrypted with age to an X25519 recipient (age1...) or under a passphrase (exactly one)."""
    import pyrage

    if (recipient is None) == (passphrase is None):
        raise ValueError("protect takes a recipient or a passphrase")
    if passphrase is not None:
        return pyrage.passphrase.encrypt(packed, checked_passphrase(passphrase))
    return pyrage.encrypt(packed, [age_recipient(recipient or "")])


def checked_passphrase(passphrase: str) -> str:
    """The passphrase, if it is long enough to protect an archive."""
    if len(passphrase) < MIN_PASSPHRASE:
        raise RegistryError(f"the archive's passphrase is shorter than {MIN_PASSPHRASE} characters",
                            hint="choose a longer one, or encrypt to an age recipient instead")
    return passphrase


def save(path: Path, packed: bytes, *, recipient: str | None = None, passphrase: str | None = None) -> bytes:
    """Write the archive to a new file (0600, whole or not at all), encrypted as asked (plaintext when given
    neither); what was written."""
    data = packed if recipient is None and passphrase is None else protect(packed, recipient=recipient,
                                                                            passphrase=passphrase)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.link(partial, path)  # fails rather than replace a file made meanwhile
    except FileExistsError as exc:
        raise RegistryError(f"{path} exists: an archive is never written over a file",
                            hint="give a new file name") from exc
    except OSError as exc:
        raise RegistryError(f"cannot write {path}: {exc.strerror}", hint="give a file in a folder you may write to"
                            ) from exc
    finally:
        partial.unlink(missing_ok=True)
    return data


def age_recipient(text: str) -> Any:
    """An age X25519 recipient (pyrage's), or RegistryError saying what one looks like."""
    import pyrage

    try:
        return pyrage.x25519.Recipient.from_str(text.strip())
    except pyrage.RecipientError as exc:
        raise RegistryError(f"{text[:80]!r} is not an age X25519 recipient: {exc}",
                            hint="give the public key that 'age-keygen' prints: age1 and 58 more characters") from exc


@dataclass(frozen=True)
class Verified:
    checked: signed.Checked
    card: dict[str, Any]
    sha256: str  # of the archive inside any encryption: what the export's audit record names
    encrypted: bool


def verify(data: bytes, *, identity: str | None = None, passphrase: str | None = None,
           public_key: str | None = None, checkpoint: Path | None = None) -> Verified:
    """Check an archive (decrypted first with an age identity or a passphrase where it is encrypted): its signature
    and every file; RegistryError naming what fails."""
    encrypted = data.startswith(AGE_MAGIC)
    packed = decrypt(data, identity, passphrase) if encrypted else data
    try:
        files = archive.unpack(packed)
    except ArtifactError as exc:
        raise RegistryError(f"the archive is not a readable tar: {exc.message.split(': ', 1)[-1]}",
                            hint="it may be cut short: copy it again, or export again") from exc
    checked, card = check_files(files, public_key=public_key, checkpoint=checkpoint)
    return Verified(checked, card, hashlib.sha256(packed).hexdigest(), encrypted)


def check_files(files: dict[str, bytes], *, public_key: str | None = None,
                checkpoint: Path | None = None) -> tuple[signed.Checked, dict[str, Any]]:
    """An unpacked archive's signature and every file checked, and its card."""
    checked = signed.check(files, kind=FORMAT, noun="archive", error=RegistryError, public_key=public_key,
                           checkpoint=checkpoint, again="export the model again from the appliance")
    if "card.json" not in checked.manifest["files"]:
        raise RegistryError("the archive has no model card (card.json)", hint="it is not an appliance model export")
    return checked, json.loads(files["card.json"])


def read_archive(path: Path, limit_mb: float) -> bytes:
    """An archive's bytes, held whole to verify or decrypt it: refused past what the daemon takes in (a pipe or a
    device never)."""
    return files.read_file(path, "the archive", int(limit_mb * 2**20), error=RegistryError,
                           over=f"the appliance takes an archive of up to daemon.max_upload_mb ({limit_mb:g} MiB):"
                                " raise it in the config file if this one is right")


def is_encrypted(path: Path) -> bool:
    """Whether path is an archive encrypted with age, to be opened here before the daemon gets what is inside."""
    if not path.is_file():  # a folder, or what regular_file() refuses when it is sent
        return False
    with path.open("rb") as file:
        return file.read(len(AGE_MAGIC)) == AGE_MAGIC


def decrypt(data: bytes, identity: str | None, passphrase: str | None) -> bytes:
    """An age-encrypted archive opened with an identity (the file age-keygen wrote) or a passphrase."""
    import pyrage

    try:
        if identity is not None:
            return pyrage.decrypt(data, [pyrage.x25519.Identity.from_str(_identity_line(identity))])
        if passphrase is not None:
            return pyrage.passphrase.decrypt(data, passphrase)
    except pyrage.IdentityError as exc:
        raise RegistryError(f"the identity file cannot be read: {exc}", hint="give a file that age-keygen wrote") from exc
    except pyrage.DecryptError as exc:
        # age says which part failed: the header, which the key or passphrase opens, or the payload after it
        if str(exc) in _WRONG_KEY:
            raise RegistryError("the archive cannot be decrypted: it was not exported to this identity or passphrase",
                                hint="give the identity or passphrase it was exported to") from exc
        raise RegistryError(f"the archive is damaged or cut short ({exc})",
                            hint="copy it again from where it was exported, or export it again") from exc
    raise RegistryError("the archive is encrypted (age)", hint="give the identity file it was exported to "
                        "(--identity), or its passphrase")


_WRONG_KEY = ("Decryption failed", "No matching keys found")  # pyrage's words when no stanza of the header opens


def _identity_line(text: str) -> str:
    """The AGE-SECRET-KEY line of an identity file (age-keygen writes comments around it)."""
    for line in text.splitlines():
        if line.strip().startswith("AGE-SECRET-KEY-"):
            return line.strip()
    raise RegistryError("no AGE-SECRET-KEY line in the identity file", hint="give a file that age-keygen wrote")


def model_card(store: Store, version: registry.ModelVersion, bundle: dict[str, bytes], fmt: Format, variant: str,
               files: dict[str, bytes]) -> dict[str, Any]:
    """What a user of the exported model needs to know about it, and where it came from (bundle: the version's
    torch bundle, or an import's FP32 IR, unpacked)."""
    manifest = json.loads(bundle["appliance.json"])
    run = runs.get(store, version.run_id)
    dataset = datasets.get(store, run.dataset_id)
    return {
        "model": version.ref, "task": version.task, "format": fmt, "variant": variant,
        "exported_at": clock.stamp(),
        "labels": manifest["labels"], **_reading(manifest, bundle),
        "inputs": graph_inputs(fmt, files),
        "outputs": ["logits"], "probabilities": "softmax over logits; label i is labels[i]",
        "base_model": {"path": run.base_model, "licence": _licence(run)},
        "dataset": {"ref": dataset.ref, "sha256": dataset.blob_id, "examples": dataset.examples},
        "trained_on": run.trained_on or "this appliance",
        "metrics": {"validation": version.variants[variant].metrics,
                    "validation_fp32": (version.variants.get(TORCH) or version.variants[FP32]).metrics},
        "guard": {"chosen": version.chosen, "reason": version.reason},
        "params": run.params,
    }


def _reading(manifest: dict[str, Any], bundle: dict[str, bytes]) -> dict[str, Any]:
    """How the model reads an example: a text model's max_length and how a longer text is cut (its tokenizer's files
    are beside it), an image model's preprocessing, spelled out for a user without the appliance."""
    if manifest.get("task") != datasets.IMAGE:
        reader = words.Words.of(bundle, manifest)
        return {"max_length": reader.max_length, "truncation": reader.truncation,
                "kept_tokens": {"head": reader.head, "tail": reader.tail}}
    return {"preprocessing": {
        "image_size": manifest["image_size"], "mean": manifest["mean"], "std": manifest["std"],
        "centre": pixels.CENTRE,
        "how": "RGB; the centred square of `centre` of the shorter side, resized to image_size x image_size "
               "(bilinear); values / 255, then (value - mean) / std per channel; float32, channels first "
               "(N x 3 x image_size x image_size), as input pixel_values"}}


def graph_inputs(fmt: Format, files: dict[str, bytes]) -> list[str]:
    """The inputs the exported graph takes, by name; a Hugging Face model takes what its tokenizer gives."""
    if fmt == "onnx":
        return [node.name for node in inference.onnx_session(files["model.onnx"]).get_inputs()]
    if fmt == "openvino":
        model = inference.read_openvino(inference.Artifact(files["model.xml"], files["model.bin"]))
        return [port.get_any_name() for port in model.inputs]
    return ["what the tokenizer gives"]


def _licence(run: runs.Run) -> str:
    """The base model's licence: as an imported model's card said it (its base model's path is only words from that
    card, never a folder to open), else as the card of the base model trained from here says it."""
    imported = run.params.get("imported")
    if imported is not None:
        return imported.get("licence") or "unknown: the imported model's card states none"
    return base_licence(Path(run.base_model))


def base_licence(base_dir: Path) -> str:
    """The licence the base model's model card (README.md front matter) states, or that it states none."""
    card = base_dir / "README.md"
    try:
        files.regular_file(card, "the base model's card")  # a pipe there would hang the export
        with card.open("rb") as file:
            text = file.read(20_000).decode(errors="replace")  # front matter comes first
    except (OSError, ApplianceError):
        return "unknown: the base model's folder has no README.md here"
    return stated_licence(text) or "unknown: the base model's card states none"


def stated_licence(card: str) -> str | None:
    """The licence a Hugging Face model card (README.md) states in its front matter."""
    front = card.split("---", 2)[1] if card.startswith("---") else ""
    found = re.search(r"^licen[cs]e:\s*(\S+)", front, re.MULTILINE)
    return found.group(1) if found else None


def _model_files(store: Store, version: registry.ModelVersion, bundle: dict[str, bytes],
                 fmt: Format) -> tuple[dict[str, bytes], str]:
    """The model's files in the format, and which variant they are."""
    tokenizer = {name: data for name, data in bundle.items() if name not in FOREIGN_FILES + MODEL_FILES}
    if TORCH not in version.variants and (fmt != "openvino" or not version.servable):
        raise RegistryError(f"{version.ref} was imported without torch weights, so it can be exported as openvino"
                            " only", hint=f"'appliance models export {version.ref} --format openvino'")
    if fmt == "hf":
        if version.task == datasets.IMAGE:
            raise RegistryError(f"{version.ref} is an image model, which has no Hugging Face form",
                                hint="export it as onnx or openvino")
        manifest = json.loads(bundle["appliance.json"])
        if "architecture" in manifest:  # the mean-pooled classifier, the only other one
            return _sentence_transformer(bundle, manifest) | tokenizer, TORCH
        return {name: data for name, data in bundle.items() if name not in FOREIGN_FILES}, TORCH
    if fmt == "openvino" and version.servable:
        ir = archive.unpack(blobs.read(store, version.serving_variant().blob_id))
        return {"model.xml": ir["model.xml"], "model.bin": ir["model.bin"], **tokenizer}, version.chosen
    return _converted(bundle, fmt) | tokenizer, TORCH


def _sentence_transformer(bundle: dict[str, bytes], manifest: dict[str, Any]) -> dict[str, bytes]:
    """A mean-pooled classifier as the sentence-transformers layout reads it, which no Hugging Face sequence classifier
    can hold: the encoder as a Hugging Face model directory (AutoModel loads it), the mean of its token states, and
    the classifier as a Dense layer with no activation, so that SentenceTransformer(...).encode() gives the logits."""
    from safetensors.numpy import load, save

    weights = load(bundle["model.safetensors"])
    encoder = {name.removeprefix("encoder."): array for name, array in weights.items() if name.startswith("encoder.")}
    head = {"linear.weight": weights["classifier.weight"], "linear.bias": weights["classifier.bias"]}
    labels, hidden = head["linear.weight"].shape
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    as_json = lambda value: json.dumps(value, indent=2).encode()
    return {
        "config.json": bundle["config.json"], "model.safetensors": save(encoder), "modules.json": as_json(modules),
        "sentence_bert_config.json": as_json({"max_seq_length": words.Words.of(bundle, manifest).max_length,
                                              "do_lower_case": False}),
        "1_Pooling/config.json": as_json({"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True}),
        "2_Dense/config.json": as_json({"in_features": hidden, "out_features": labels, "bias": True,
                                        "activation_function": "torch.nn.modules.linear.Identity"}),
        "2_Dense/model.safetensors": save(head),
    }


def _converted(bundle: dict[str, bytes], fmt: Format) -> dict[str, bytes]:
    """The torch bundle as ONNX, or as an FP32 OpenVINO IR where the version was never optimised (needs torch)."""
    from appliance import optimize
    from appliance.train import bundle as bundles
    from appliance.train import images

    if json.loads(bundle["appliance.json"])["task"] == datasets.IMAGE:
        model, manifest = images.load_image_classifier(bundle)
        if fmt == "onnx":
            return {"model.onnx": images.export_onnx(model, manifest["image_size"])}
        ir = optimize.serialize(images.convert_openvino(model, manifest["image_size"]))
        return {"model.xml": ir.xml, "model.bin": ir.weights}
    model, _tokenizer, manifest = bundles.load_text_classifier(bundle)
    if fmt == "onnx":
        return {"model.onnx": optimize.export_onnx(model, manifest["max_length"])}
    ir = optimize.export_openvino(model, manifest["max_length"])
    return {"model.xml": ir.xml, "model.bin": ir.weights}
