"""A trained text-classification bundle back in torch: the classifier, its reader and its manifest.

The bundle is the one `tasks.TextClassification.bundle` writes: a Hugging Face sequence
classifier, or the mean-pooled one (a sentence encoder's, or fast mode's) where its manifest
says so. It is rebuilt from bytes, never from files, because no plaintext weight may reach a
disk. `TorchRunner` dresses the classifier as an onnxruntime session, so the inference
kernel's predict and evaluate score it exactly as they score a compiled model;
`convert_openvino` makes it an OpenVINO model in memory, for the optimiser's export and
fast mode's embedding.
"""

from __future__ import annotations

import inspect
import io
import json
import warnings
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import openvino as ov
import torch

from appliance import inference, words
from appliance.core.errors import OptimizeError
from appliance.train import tasks


def load_text_classifier(files: Mapping[str, bytes]) -> tuple[torch.nn.Module, words.Words, dict[str, Any]]:
    """Rebuild the classifier, its reader and its manifest from bundle bytes, without temporary files."""
    from safetensors.torch import load as load_safetensors
    from transformers import CONFIG_MAPPING, AutoModelForSequenceClassification
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    manifest = json.loads(files["appliance.json"]) if "appliance.json" in files else {}
    if manifest and manifest.get("task") != tasks.TextClassification.kind:
        raise OptimizeError(f"only text-classification models can be optimised, not {manifest.get('task')!r}")
    missing = {"config.json", "model.safetensors", "tokenizer.json", "appliance.json"} - set(files)
    if missing:
        raise OptimizeError(f"the model bundle lacks {', '.join(sorted(missing))}")
    config_dict = json.loads(files["config.json"])
    config = CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
    if manifest.get("architecture") == tasks.MEAN_POOLED:
        model = tasks.classifier(config, len(manifest["labels"]))
    elif "architecture" in manifest:
        raise OptimizeError(f"the model bundle's architecture {manifest['architecture']!r} is not one this appliance "
                            "builds", hint="train it again with this appliance's version")
    else:
        model = AutoModelForSequenceClassification.from_config(config)
    model.load_state_dict(load_safetensors(files["model.safetensors"]))
    return model.eval(), words.Words.of(files, manifest), manifest


def input_names(model: torch.nn.Module) -> list[str]:
    """The inputs a classifier takes, in INPUTS order: token_type_ids only where its encoder has them."""
    return [name for name in inference.INPUTS if name in inspect.signature(model.base_model.forward).parameters]


class TorchRunner:
    """A torch classifier in the shape of an onnxruntime session, so the kernel's predict and evaluate take it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.names = input_names(model)
        self.device = next(model.parameters()).device  # a model being distilled may be on a GPU

    def get_inputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=name) for name in self.names]

    @torch.no_grad()
    def run(self, _outputs: None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        inputs = {name: torch.from_numpy(array).to(self.device) for name, array in feeds.items()}
        return [self.model(**inputs).logits.float().cpu().numpy()]


# -- the classifier as OpenVINO converts it ------------------------------------------------


class _Logits(torch.nn.Module):
    """The classifier as tensors in, logits out, with the attention mask already 4-D (tasks.additive_mask: tracing
    cannot build it; the mean-pooled classifier builds its own, as it pools by the 2-D one)."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.names = model, tuple(names)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        inputs = dict(zip(self.names, tensors))
        if not isinstance(self.model, tasks.MeanPooledClassifier):  # which needs the padding mask to pool
            inputs["attention_mask"] = tasks.additive_mask(inputs["attention_mask"])
        return self.model(**inputs).logits


def traceable(model: torch.nn.Module, max_length: int) -> tuple[_Logits, tuple[torch.Tensor, ...]]:
    """The wrapped model and a padded example batch, with token_type_ids only if the model takes them."""
    names = input_names(model)
    width = max(2, min(max_length, 16))
    ids = torch.full((2, width), 100, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, width // 2 :] = 0  # a padded row, so nothing about padding is traced as a constant
    example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    # A new module starts in training mode, and exporters restore that mode on exit, recursively.
    return _Logits(model, names).eval(), tuple(example[name] for name in names)


def onnx_bytes(module: torch.nn.Module, example: tuple[torch.Tensor, ...], inputs: Sequence[str],
               dynamic_axes: dict[str, dict[int, str]]) -> bytes:
    """ONNX bytes from the TorchScript exporter (the dynamo one needs onnxscript, which is not installed), the one
    output named logits: a text model's export and an image model's."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # its own deprecation notice, and the tracer's
            torch.onnx.export(module, example, buffer, dynamo=False, input_names=list(inputs),
                              output_names=["logits"], dynamic_axes=dynamic_axes, opset_version=17)
    except torch.onnx.OnnxExporterError as exc:
        raise OptimizeError(f"ONNX export failed: {exc}", hint="the 'onnx' package must be installed") from exc
    return buffer.getvalue()


def convert_openvino(model: torch.nn.Module, max_length: int) -> ov.Model:
    """The classifier as an OpenVINO model taking the tokenizer's int64 inputs and giving "logits"."""
    wrapper, example = traceable(model, max_length)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer and deprecation notes about code paths BERT does not take
            converted = ov.convert_model(wrapper, example_input=example)
    except Exception as exc:  # the frontend raises many types; all mean the same to an operator
        raise OptimizeError(f"OpenVINO could not convert the model: {exc}") from exc
    for port, name in zip(converted.inputs, wrapper.names):
        port.get_tensor().set_names({name})
    converted.outputs[0].get_tensor().set_names({"logits"})
    return converted
