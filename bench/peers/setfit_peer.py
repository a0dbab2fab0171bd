"""SetFit, as its documentation shows it, on a split handed over as JSON: the peer of fast mode in bench/train.py.

It runs in its own environment (bench/peers/setfit-env.sh makes it): setfit pulls in `datasets` and a newer
huggingface_hub than the appliance pins. Input on stdin: {"base_dir", "train": [[text, label], ...],
"validation": [...], "budget_s", "seed", "threads"}. Output: one JSON line with the validation accuracy, the
training seconds (the contrastive body and the logistic-regression head), the seconds including loading, and the
steps run. Training stops at budget_s, as the appliance's --max-minutes does.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset
from setfit import SetFitModel, Trainer, TrainingArguments
from transformers import TrainerCallback


def main() -> None:
    job = json.load(sys.stdin)
    torch.set_num_threads(job["threads"])
    began = time.perf_counter()
    model = SetFitModel.from_pretrained(job["base_dir"])
    train = Dataset.from_dict({"text": [t for t, _ in job["train"]], "label": [label for _, label in job["train"]]})
    clock = {"start": 0.0, "steps": 0}

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock["steps"] = state.global_step
            if time.perf_counter() - clock["start"] >= job["budget_s"]:
                control.should_training_stop = True

    args = TrainingArguments(batch_size=16, num_epochs=1, seed=job["seed"], show_progress_bar=False)
    trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[Budget()])
    clock["start"] = time.perf_counter()
    trainer.train()
    trained = time.perf_counter()
    predicted = model.predict([t for t, _ in job["validation"]])
    right = sum(p == label for p, (_, label) in zip(predicted, job["validation"]))
    print(json.dumps({"accuracy": right / len(job["validation"]), "train_s": trained - clock["start"],
                      "end_to_end_s": trained - began, "steps": clock["steps"]}))


if __name__ == "__main__":
    main()
