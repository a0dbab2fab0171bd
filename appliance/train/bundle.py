"""A trained text-classification bundle back in torch: the classifier, its tokenizer and its manifest.

The bundle is the one `tasks.TextClassification.bundle` writes: a Hugging Face sequence
classifier, or fast mode's MeanPooledClassifier where its manifest says so. It is rebuilt from bytes,
never from files, because no plaintext weight may reach a disk. `TorchRunner` dresses
the classifier as an onnxruntime session, so the inference kernel's predict and
evaluate score it exactly as they score a compiled model.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import tokenizers
import torch

from appliance import inference
from appliance.core.errors import OptimizeError
from appliance.train import fast, tasks


def load_text_classifier(files: Mapping[str, bytes]) -> tuple[torch.nn.Module, tokenizers.Tokenizer, dict[str, Any]]:
    """Rebuild the classifier, its tokenizer and its manifest from bundle bytes, without temporary files."""
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
    if manifest.get("architecture") == fast.ARCHITECTURE:
        model = fast.classifier(config, len(manifest["labels"]))
    elif "architecture" in manifest:
        raise OptimizeError(f"the model bundle's architecture {manifest['architecture']!r} is not one this appliance "
                            "builds", hint="train it again with this appliance's version")
    else:
        model = AutoModelForSequenceClassification.from_config(config)
    model.load_state_dict(load_safetensors(files["model.safetensors"]))
    return model.eval(), inference.load_tokenizer(files, manifest["max_length"]), manifest


def input_names(model: torch.nn.Module) -> list[str]:
    """The inputs a classifier takes, in INPUTS order: token_type_ids only where its encoder has them."""
    return [name for name in inference.INPUTS if name in inspect.signature(model.base_model.forward).parameters]


class TorchRunner:
    """A torch classifier in the shape of an onnxruntime session, so the kernel's predict and evaluate take it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.names = input_names(model)

    def get_inputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=name) for name in self.names]

    @torch.no_grad()
    def run(self, _outputs: None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [self.model(**{name: torch.from_numpy(array) for name, array in feeds.items()}).logits.numpy()]
