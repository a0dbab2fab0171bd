"""Distillation: a fine-tuned text classifier teaches a copy of itself cut to k of its n encoder layers.

A student of k layers spends about k/n of the teacher's encoder time. It starts from the
teacher's own embeddings, head and k layers spread over its depth (the first, then every n/k-th:
layers 0, 2 and 4 of 6), which keeps most of what the teacher knows before any training. Asked
for a width, each kept layer's feed-forward block, two thirds of the layer's matrix products,
also keeps only that many of its units, those that pass on the most (structured pruning): a
student between k and k-1 layers in time. It then learns, as TinyBERT and MiniLM students do,
from more than the labels: each of its layers is drawn towards the states of the teacher layer
it stands for (its k-th part of the teacher's depth, the last one towards the teacher's last,
which the head reads) and, when asked, towards that layer's self-attention relations (MiniLMv2:
per head, how alike the queries of a text's tokens are to each other, and its keys, and its
values), and its logits towards the teacher's softened ones (which carry how alike the classes
are, not just which one is right), beside the hard labels. The teacher runs beside it on every
batch, so it can teach on texts that have no label too: each epoch every training text comes
once more a little changed (some words dropped, or a part of it), as TinyBERT augments its data,
and the student learns the teacher's states and soft labels on it. Unless a rate is given, the
first epoch is a search: a student for each of a few learning rates trains on the same batches
(the teacher runs once for all of them), and only the one best on validation goes on. On a box
with a CUDA GPU it all runs there, as a training run would (bf16, or fp16 with a gradient scaler
where the GPU lacks bf16); on a CPU with native bf16 the passes run in bf16 autocast, as
training's do. max_steps bounds the whole: on a large dataset each epoch trains on a fresh
sample of its batches, and a large validation split is scored on a stratified sample, as
training scores it. The result is a bundle of the
teacher's form, so optimize.optimize exports and quantises it as is. Everything stays in memory:
no plaintext weight reaches a disk.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from appliance import inference
from appliance.core import archive, hardware
from appliance.core.errors import JobInterrupted, OptimizeError
from appliance.core.hardware import Cpu, Hardware
from appliance.core.text import counted
from appliance.data.datasets import LoadedDataset
from appliance.train.bundle import TorchRunner, input_names, load_text_classifier
from appliance.train.engine import EVAL_SAMPLE
from appliance.train.tasks import adamw, attention_kernel, autocast, autocast_dtype, use_attention

LAYER_PATHS = ("encoder.layer", "transformer.layer")  # BERT, MiniLM, RoBERTa, ELECTRA; DistilBERT
# Where, inside one of those layers, its self-attention's query, key and value projections are.
PROJECTION_PATHS = (("attention.self.query", "attention.self.key", "attention.self.value"),  # BERT-like
                    ("attention.q_lin", "attention.k_lin", "attention.v_lin"))  # DistilBERT
# Where a layer's feed-forward block is (its two linear maps), and the config's name for its width.
FEED_FORWARD_PATHS = (("intermediate.dense", "output.dense", "intermediate_size"),  # BERT-like
                      ("ffn.lin1", "ffn.lin2", "hidden_dim"))  # DistilBERT
# The training texts (a seeded sample) whose activations choose the feed-forward units a narrower student keeps.
NARROWING_TEXTS = 256
NO_LABEL = -1  # a variant's label: the teacher alone teaches on it
CPU = torch.device("cpu")  # where the student is built, narrowed and stored


@dataclass(frozen=True)
class DistillParams:
    """How to distil: the student's depth and the training settings."""

    layers: int  # how many of the teacher's encoder layers the student keeps (1 <= layers < teacher's; spread())
    # At least; more where the data is too small for min_steps. Enough steps matter more than how the student is
    # taught: on fortunes split with seed 14 (teacher 85.44%), 4 epochs of one variant a text fell 1.1-1.9 points
    # short (84.30%, 84.30%, 83.50% drawn with three seeds; nor did rates, attention relations or a second variant
    # at 4 epochs bring it within 1), while 8 epochs of two variants scored 85.44% (fp32, 3e-4) and 84.63% (bf16,
    # searched); in bf16, 8 epochs of one variant and 6 of two scored 84.47% each.
    epochs: int = 8
    # At 3e-4 a small dataset needs more passes: on the bundled sample (240 texts, 15 steps an epoch) a student stopped
    # at 91.67% after 60 steps and reached the teacher's 95.00% after 120 and 240.
    min_steps: int = 150
    # At most, so a large dataset does not take days: there each epoch trains on a fresh random sample of the
    # data's batches, max_steps // epochs of them (a step costs 0.3-0.8 s on a 2-core CPU, fp32 or bf16).
    max_steps: int = 4000
    # None: chosen among LEARNING_RATES by the first epoch (distill()). The best rate moves with the data: cut to its
    # first layers and taught by the logits alone, a student had far to move and wanted 1e-3; drawn towards the
    # teacher's states it moves less: on fortunes (bench/fortunes.py) split with seed 14, teacher 85.44%, 1e-4 gave
    # 83.98%, 3e-4 84.30% and 1e-3 82.85% (83.98%, 82.36% and 76.86% after one epoch); searched, 1e-4 and 84.30%.
    learning_rate: float | None = None
    batch_size: int = 32
    temperature: float = 2.0
    alpha: float = 0.5  # weight of the soft (KL) loss; 1 - alpha on the hard cross-entropy
    # Weight of the layers' loss (the mean squared distance of a student layer's token states to its teacher
    # layer's, averaged over the layers), beside the logits' losses (about 0.1-1 at the start). On all-MiniLM-L6-v2
    # fine-tuned on 2,475 fortunes (seed 13; validation 618, teacher 84.47%), a 3-layer student of layers 0, 2, 4 at
    # 1e-3: 83.01% with 0, 84.14% with 10; the first three layers without it 82.52%, as many epochs again 82.85%.
    hidden_weight: float = 10.0
    # Weight of the self-attention relations' loss (MiniLMv2): within each student layer and its teacher layer, how
    # alike each token's query is to every other token's query, per head (a softmax over the tokens), and the same for
    # keys and for values; the loss is the KL divergence of the student's relations from the teacher's. Off by
    # default: beside the layers' loss it moved nothing but the time. On fortunes split with seed 14 (teacher 85.44%,
    # 4 epochs), 1e-4: 83.98% without, 84.30% with 1 (84.14% on the last layer only); 3e-4: 84.30% without, 83.66%
    # with 1; a step took 1.5-1.7x as long.
    attention_weight: float = 0.0
    # Changed copies of each training text an epoch, taught by the teacher alone (each one more pass of the data).
    # In the run above, with the layers' loss: 84.95% with one, 84.14% with none; for two, see epochs.
    variants: int = 2
    # The units each student layer keeps in its feed-forward block (None: all, the teacher's intermediate size): those
    # that pass on the most over some training texts. The block is two thirds of a layer's matrix products: capped at
    # AVX2, 3 MiniLM layers of 1,024 units (of 1,536) ran 3.09x torch eager at batch 16, against 2.44x for 3 full
    # layers and 3.48x for 2. On fortunes, distilled in fp32 under the same cap (bench/infer, README), 3 layers of
    # 1,024 lost 0.48 points (seed 13) and 0.81 (seed 14) at 3.2x, where 2 layers lost 0.97 and 3.72.
    width: int | None = None
    seed: int = 0

    @property
    def shape(self) -> str:
        """The student's shape in words: '3-layer', or '3-layer, 768-wide'."""
        return f"{self.layers}-layer" + (f", {self.width}-wide" if self.width is not None else "")


def sized_for(config: Mapping[str, Any], cpu: Cpu, layers: int | None = None,
              width: int | None = None) -> tuple[DistillParams, str]:
    """The student to distil from a teacher (its config.json) for serving on this CPU, and how the shape was chosen,
    in words for the version's reason ('' when the caller chose it). What the caller names is kept. Left open, the
    student keeps half the teacher's layers and, where the CPU computes neither bf16 nor int8 natively (no AMX,
    AVX-512 BF16 or VNNI), two thirds of their feed-forward units. Measured on MiniLM-L6 (README): with AMX, 3 full
    layers of 6 ran 5-7x torch eager at batch 16 within a point of the teacher; capped at AVX2 they ran 2.4x, and
    1,024 units of 1,536 made it 3.2x, 0.5-0.8 points below the teacher."""
    depth = config.get("num_hidden_layers", config.get("n_layers"))  # BERT-like; DistilBERT
    full = next((config[key] for _, _, key in FEED_FORWARD_PATHS if isinstance(config.get(key), int)), 0)
    if width is not None and full:
        _check_width(width, full)  # here, before any work; distill() checks what its model has, too
    if layers is not None:
        if isinstance(depth, int):
            _check_depth(layers, depth)
        return DistillParams(layers=layers, width=width), ""
    if not isinstance(depth, int) or depth < 2:
        raise OptimizeError(f"cannot size a student for this teacher: its config gives {depth!r} encoder layers",
                            hint="distillation needs a text encoder of at least 2 layers (BERT, MiniLM, DistilBERT)")
    why = f"half the teacher's {depth} layers"
    if width is None and full >= 3:
        if cpu.fast_bf16 or cpu.fast_int8:
            why += ", all their feed-forward units: this CPU computes bf16 or int8 natively"
        else:
            width = full * 2 // 3 // 32 * 32 or full * 2 // 3  # a multiple of 32 where there are that many
            why += (f", {width:,} of their {full:,} feed-forward units: this CPU computes neither bf16 nor int8 "
                    "natively (no AMX, AVX-512 BF16 or VNNI), so a narrower student for speed")
    return DistillParams(layers=depth // 2, width=width), why


# The rates a search tries, in order of preference: a tie goes to the first. 3e-4 first, as the one that did best on
# the real data tried (above); a smaller and a larger one beside it.
LEARNING_RATES = (3e-4, 1e-4, 1e-3)


@dataclass(frozen=True)
class Student:
    """The distilled bundle, its validation scores beside the teacher's, how it was taught, its rate (and, when the
    rate was searched, each rate's validation scores after the first epoch), and how long it took (epochs and
    seconds)."""

    bundle: bytes  # same files as a training bundle: config.json, model.safetensors, tokenizer files, appliance.json
    metrics: dict[str, float]
    teacher_metrics: dict[str, float]
    params: DistillParams
    epochs: int
    planned_epochs: int  # more than epochs where its time limit cut it short
    seconds: float
    learning_rate: float
    searched: dict[float, dict[str, float]]  # empty when the rate was given
    precision: torch.dtype | None  # the passes' autocast; None: fp32
    device: str  # where it was taught: "cpu", "cuda:0"
    epoch_batches: int  # the batches each epoch trained on: all of the data's, or a sample (max_steps)
    data_batches: int  # the batches an epoch of the data (texts and variants) holds
    evaluated_on: int  # the validation examples scored: all, or a stratified sample of a large split
    validation_examples: int

    @property
    def layers(self) -> int:
        return self.params.layers

    def describe(self) -> str:
        """How the student was taught and how it scored, in words for a report."""
        if self.searched:
            tried = ", ".join(f"{rate:g} {scores['macro_f1']:.3f}" for rate, scores in self.searched.items())
            rate = f"lr {self.learning_rate:g}, the best by validation macro-F1 after the first epoch ({tried})"
        else:
            rate = f"lr {self.learning_rate:g} as given"
        taught = ["soft labels" if self.params.alpha else "", "layers' states" if self.params.hidden_weight else "",
                  "attention relations" if self.params.attention_weight else ""]
        autocast = f" in {str(self.precision).removeprefix('torch.')} autocast" if self.precision else ""
        autocast += f" on {self.device}" if self.device != "cpu" else ""
        sampled = (f" (each {self.epoch_batches:,} batches drawn from the data's {self.data_batches:,})"
                   if self.epoch_batches < self.data_batches else "")
        scored = (f" (on a stratified sample of {self.evaluated_on:,} of {self.validation_examples:,} validation "
                  "examples)" if self.evaluated_on < self.validation_examples else "")
        cut = (f" (of {self.planned_epochs}: as many as its time limit held)" if self.epochs < self.planned_epochs
               else "")
        return (f"{self.params.shape} student, {counted(self.epochs, 'epoch')}{cut}{sampled}{autocast} at {rate}, taught the "
                f"teacher's {', '.join(filter(None, taught)) or 'nothing but the labels'}: accuracy "
                f"{self.metrics['accuracy']:.3f} against the teacher's {self.teacher_metrics['accuracy']:.3f}{scored}")


def distill(
    teacher_bundle: bytes,
    data: LoadedDataset,
    params: DistillParams,
    *,
    device: torch.device = CPU,
    precision: torch.dtype | None = None,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    within_s: float | None = None,
) -> Student:
    """Train a k-layer student on the teacher's layer states and soft labels and on the hard labels; keep its best
    epoch. The teacher and the students run on device, their passes in autocast to precision (see `placed`; None:
    fp32), the losses and the weights in fp32; fp16 scales the gradients. Progress counts student steps: in the
    search's epoch, one a batch for each rate tried.

    within_s limits the whole, from its start: after each epoch, the epochs left are cut to as many as fit at the pace
    measured (_epoch_pace_s), and the learning rate's schedule refitted to end with the last, as training to a budget
    does; the first epoch always runs, so a limit shorter than it is passed by the rest of that epoch."""
    started = time.monotonic()
    files = archive.unpack(teacher_bundle)
    try:
        model, reader, manifest = load_text_classifier(files)
    except OptimizeError as exc:
        raise OptimizeError(f"cannot distil this model: {exc.message}", hint=exc.hint or (
            "distillation takes a fine-tuned text-classification bundle, as 'appliance train' makes")) from exc
    layers = _encoder_layers(model, params.layers)
    _check(data, manifest["labels"], params)
    targets = torch.tensor([manifest["labels"].index(label) for label in data.labels])
    scored = data.validation_sample(EVAL_SAMPLE, params.seed)  # a large split's sample, as training scores it
    validation = [data.texts[i] for i in scored], targets[scored].tolist()

    model.to(device)
    teacher_metrics = inference.evaluate(TorchRunner(model), reader, *validation)
    teacher = copy.deepcopy(model)
    kept, matched = spread(len(layers), params.layers)
    teacher_taps = _Taps(_encoder_layers(teacher, params.layers), matched, projections=params.attention_weight > 0)
    kept_layers = [layers[i] for i in kept]
    del layers[:]  # the model becomes the student
    layers.extend(kept_layers)
    model.config.num_hidden_layers = params.layers
    use_attention(model, attention_kernel(device, reader.max_length))  # the students', as training's
    names = input_names(model)
    if params.width is not None:  # measured on the cut student: its layers' inputs are no longer the teacher's
        drawn = random.Random(params.seed).sample(data.train, min(NARROWING_TEXTS, len(data.train)))
        sample = [data.texts[i] for i in drawn]  # drawn, not the first: a file may hold its labels one after another
        _narrow(model.eval(), kept_layers, params.width, [inference.encode(reader, sample[start:start + 32], names)
                                                          for start in range(0, len(sample), 32)])

    torch.manual_seed(params.seed)
    data_batches = math.ceil(len(data.train) * (1 + params.variants) / params.batch_size)
    epochs = max(params.epochs, math.ceil(params.min_steps / data_batches))
    per_epoch = min(data_batches, params.max_steps // epochs)
    rates = (params.learning_rate,) if params.learning_rate is not None else LEARNING_RATES
    models = [model, *(copy.deepcopy(model) for _ in rates[1:])]  # copied before _Pupil hooks their layers
    pupils = [_Pupil(one, rate, per_epoch * epochs, precision, projections=params.attention_weight > 0)
              for one, rate in zip(models, rates)]
    planned, epoch = epochs, 0
    best, best_state, searched, step = None, None, {}, 0
    while epoch < epochs:
        total = per_epoch * (epochs + len(rates) - 1)  # the search's epoch takes a step a batch for each rate
        epoch_started, students = time.monotonic(), len(pupils)
        seed = params.seed * 1009 + epoch
        rng = random.Random(seed)
        texts = data.texts + [variant(data.texts[i], rng) for _ in range(params.variants) for i in data.train]
        labels = torch.cat([targets, torch.full((len(texts) - len(data.texts),), NO_LABEL)]).to(device)
        indices = [*data.train, *range(len(data.texts), len(texts))]
        for pupil in pupils:
            pupil.model.train()
        for batch in _batches(texts, indices, params.batch_size, torch.Generator().manual_seed(seed))[:per_epoch]:
            if should_stop and should_stop():
                raise JobInterrupted("distillation stopped before it finished", hint="nothing was kept; start it again")
            feeds = inference.encode(reader, [texts[i] for i in batch], names)
            inputs = {name: torch.from_numpy(array).to(device) for name, array in feeds.items()}
            with torch.no_grad(), autocast(device, precision):
                soft = teacher(**inputs).logits.float()
            for pupil in pupils:
                pupil.learn(inputs, soft, teacher_taps, labels[batch], params)
                step += 1
                if progress:
                    progress(step, total)
        scores = []
        for pupil in pupils:
            pupil.model.eval()
            scores.append(inference.evaluate(TorchRunner(pupil.model), reader, *validation))
        if len(pupils) > 1:  # the search's epoch: the best rate goes on (max keeps the first of equals)
            searched = {pupil.learning_rate: score for pupil, score in zip(pupils, scores)}
            winner = max(range(len(pupils)), key=lambda i: scores[i]["macro_f1"])
            pupils, scores = [pupils[winner]], [scores[winner]]
        if best is None or scores[0]["macro_f1"] > best["macro_f1"]:
            best = scores[0]
            best_state = {name: tensor.detach().to(CPU, copy=True) for name, tensor in pupils[0].model.state_dict().items()}
        epoch += 1
        if within_s is not None and epoch < epochs:
            pace = _epoch_pace_s(time.monotonic() - epoch_started, students)
            fitting = epoch + max(0, int((within_s - (time.monotonic() - started)) // pace))
            if fitting < epochs:
                epochs = fitting
                pupils[0].refit((epochs - epoch) * per_epoch)
    student = pupils[0].model.to(CPU)
    student.load_state_dict(best_state)
    files["config.json"] = student.config.to_json_string().encode()
    files["model.safetensors"] = save_safetensors({k: v.contiguous() for k, v in student.state_dict().items()})
    return Student(archive.pack(sorted(files.items())), best, teacher_metrics, params, epochs, planned,
                   time.monotonic() - started, pupils[0].learning_rate, searched, precision, str(device), per_epoch,
                   data_batches, len(scored), len(data.validation))


def _epoch_pace_s(last_epoch_s: float, students: int) -> float:
    """What an epoch of one student takes, from the last epoch's time with this many students (the search's epoch
    teaches several beside one teacher's passes): counted as if the teacher's pass cost a student's step, where a
    student's forward and backward passes over half the layers cost about one and a half of the teacher's forward
    pass, so it errs long."""
    return last_epoch_s * 2 / (students + 1)


def placed(machine: Hardware) -> tuple[torch.device, torch.dtype | None]:
    """Where distillation runs and its autocast, as training plans a run: the first CUDA GPU, in bf16 where it
    computes it natively, else fp16; without one, the CPU (precision_for)."""
    gpu = hardware.training_gpu(machine)
    device = torch.device(f"cuda:{gpu.index}") if gpu else CPU
    return device, autocast_dtype(hardware.training_precision(machine.cpu, gpu)[0])


def precision_for(cpu: Cpu) -> torch.dtype | None:
    """bf16 where the CPU computes it natively (AMX, AVX-512 BF16), as training plans it: on a 2-core Xeon with AMX
    an epoch of 20 steps and its evaluation (MiniLM to 3 layers, fortunes, 32 texts a step) took 7.4 s against
    12.4 s in fp32; elsewhere bf16 would be emulated and slower, so fp32."""
    return autocast_dtype(hardware.training_precision(cpu, None)[0])


class _Pupil:
    """A student learning at one rate: its model (on its device, passes in autocast to precision), optimiser and
    linear schedule, and what its layers compute."""

    def __init__(self, model: nn.Module, learning_rate: float, steps: int, precision: torch.dtype | None, *,
                 projections: bool) -> None:
        self.model, self.learning_rate, self.precision = model, learning_rate, precision
        self.device = next(model.parameters()).device
        self.taps = _Taps(_layer_list(model), range(model.config.num_hidden_layers), projections=projections)
        self.optimizer = adamw(model.parameters(), learning_rate)
        self.refit(steps)
        # fp16's small gradients would underflow unscaled
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision is torch.float16)

    def refit(self, steps: int) -> None:
        """The learning rate falls linearly from where it is now to 0 over the next `steps` steps."""
        self.scheduler = torch.optim.lr_scheduler.LinearLR(self.optimizer, 1.0, 0.0, total_iters=max(steps, 1))

    def learn(self, inputs: dict[str, torch.Tensor], soft: torch.Tensor, teacher: _Taps, labels: torch.Tensor,
              params: DistillParams) -> None:
        """One step on a batch the teacher has just seen (its logits and, in its taps, what its layers computed)."""
        with autocast(self.device, self.precision):
            logits = self.model(**inputs).logits
        loss = _loss(logits.float(), soft, labels, params)
        mask = inputs["attention_mask"]
        if params.hidden_weight:
            loss = loss + params.hidden_weight * _layers_loss(self.taps.states(), teacher.states(), mask)
        if params.attention_weight:
            loss = loss + params.attention_weight * _relations_loss(
                self.taps.projections(), teacher.projections(), mask, self.model.config.num_attention_heads)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


def _check(data: LoadedDataset, labels: Sequence[str], params: DistillParams) -> None:
    """Refuse, before any work, a dataset or settings that cannot give a student worth keeping."""
    if not data.train or not data.validation:
        raise OptimizeError(f"distillation needs training and validation examples; this dataset has "
                            f"{len(data.train)} and {len(data.validation)}",
                            hint="import more examples, or a smaller validation fraction, so both splits hold some")
    unknown = sorted(set(data.labels) - set(labels))
    if unknown:
        raise OptimizeError(f"the dataset has labels the teacher was not trained on: {', '.join(unknown)}",
                            hint="distil on the dataset version the teacher was trained on")
    if params.hidden_weight < 0 or params.attention_weight < 0:
        raise OptimizeError(f"distillation's loss weights cannot be negative, not hidden_weight {params.hidden_weight:g} "
                            f"and attention_weight {params.attention_weight:g}", hint="set each to 0 (off) or more")
    if params.epochs < 1 or params.batch_size < 1:
        raise OptimizeError(f"distillation needs at least one epoch and one example a batch, not "
                            f"{params.epochs} epochs of {params.batch_size}", hint="set epochs and batch_size to 1 or more")
    if params.max_steps < max(params.epochs, params.min_steps):
        raise OptimizeError(f"distillation's max_steps, {params.max_steps}, is below its epochs ({params.epochs}) or "
                            f"min_steps ({params.min_steps})", hint="raise max_steps, or lower epochs and min_steps")


def _encoder_layers(model: nn.Module, keep: int) -> nn.ModuleList:
    """The encoder's list of layers, once it is known that `keep` of them can be kept and some dropped."""
    layers = _layer_list(model)
    _check_depth(keep, len(layers))
    return layers


def _check_depth(keep: int, depth: int) -> None:
    if not 1 <= keep < depth:
        raise OptimizeError(f"a student must keep from 1 to {depth - 1} of the teacher's {depth} encoder layers, "
                            f"not {keep}", hint=f"choose a layer count from 1 to {depth - 1}: fewer is faster, more is "
                            "closer")


def _check_width(width: int, full: int) -> None:
    if not 1 <= width < full:
        raise OptimizeError(f"a student's feed-forward blocks can keep from 1 to {full - 1} of the teacher's {full} "
                            f"units, not {width}", hint=f"choose a width from 1 to {full - 1}: fewer is faster")


def _layer_list(model: nn.Module) -> nn.ModuleList:
    """The encoder's list of layers (LAYER_PATHS), or why the model cannot be distilled."""
    for path in LAYER_PATHS:
        layers = model.base_model
        for name in path.split("."):
            layers = getattr(layers, name, None)
        if isinstance(layers, nn.ModuleList):
            break
    else:
        raise OptimizeError(f"cannot distil a {model.config.model_type} model: it has no encoder layer list "
                            f"({' or '.join(LAYER_PATHS)})",
                            hint="distillation supports BERT-like encoders (BERT, MiniLM, RoBERTa, DistilBERT); "
                            "optimise the teacher without distilling")
    return layers


def _narrow(model: nn.Module, layers: Sequence[nn.Module], width: int, feeds: Sequence[dict]) -> None:
    """Keep in each layer's feed-forward block the `width` units that pass on the most over the texts fed (a unit's
    mean activation magnitude over the texts' tokens, padding left out, times the norm of its output weights), as
    structured pruning does; what the others passed on on average moves into the block's output bias, so the layer's
    mean output stays where it was."""
    first_path, second_path, config_key = _feed_forward_paths(layers[0])
    blocks = [(layer.get_submodule(first_path), layer.get_submodule(second_path)) for layer in layers]
    full = blocks[0][0].out_features
    _check_width(width, full)
    device = blocks[0][0].weight.device
    magnitude, total = torch.zeros(len(blocks), full, device=device), torch.zeros(len(blocks), full, device=device)
    tokens, real = 0, torch.ones(0, dtype=torch.bool)  # real: the batch being fed's tokens that are not padding

    def tally(index: int, activations: torch.Tensor) -> None:
        taken = activations.detach().float()[real]
        magnitude[index] += taken.abs().sum(0)
        total[index] += taken.sum(0)

    hooks = [second.register_forward_pre_hook(lambda _module, args, index=index: tally(index, args[0]))
             for index, (_, second) in enumerate(blocks)]
    with torch.no_grad():
        for feed in feeds:
            inputs = {name: torch.from_numpy(array).to(device) for name, array in feed.items()}
            real = inputs["attention_mask"].bool()
            tokens += int(real.sum())
            model(**inputs)
        for hook in hooks:
            hook.remove()
        for (first, second), passed, average in zip(blocks, magnitude / tokens, total / tokens):
            order = torch.argsort(passed * second.weight.norm(dim=0), descending=True)
            keep, dropped = order[:width].sort().values, order[width:]
            second.bias += second.weight[:, dropped] @ average[dropped]
            first.weight, first.bias = nn.Parameter(first.weight[keep].clone()), nn.Parameter(first.bias[keep].clone())
            second.weight = nn.Parameter(second.weight[:, keep].clone())
            first.out_features = second.in_features = width
    setattr(model.config, config_key, width)


def _feed_forward_paths(layer: nn.Module) -> tuple[str, str, str]:
    """Where the layer's feed-forward block is, and the config's name for its width (FEED_FORWARD_PATHS)."""
    for first, second, config_key in FEED_FORWARD_PATHS:
        try:
            layer.get_submodule(first), layer.get_submodule(second)
        except AttributeError:
            continue
        return first, second, config_key
    raise OptimizeError(f"cannot narrow this model's student: its encoder layers have no feed-forward block "
                        f"({' or '.join(paths[0] for paths in FEED_FORWARD_PATHS)})",
                        hint="distil it without a width: the student keeps the teacher's feed-forward blocks")


def spread(teacher_layers: int, student_layers: int) -> tuple[list[int], list[int]]:
    """Which teacher layers a student keeps (the first, then every n/k-th), and which teacher layer each kept one is
    drawn towards: the one just below the next kept layer, the last towards the last (6 to 3: 0, 2, 4 and 1, 3, 5)."""
    kept = [round(j * teacher_layers / student_layers) for j in range(student_layers)]
    return kept, [following - 1 for following in [*kept[1:], teacher_layers]]


class _Taps:
    """What chosen layers of an encoder computed in its last forward pass: each one's token states, and (when
    asked) its self-attention's queries, keys and values; in the order chosen, in fp32 whatever the autocast."""

    def __init__(self, layers: nn.ModuleList, chosen: Iterable[int], *, projections: bool) -> None:
        self.seen: dict[tuple[int, str], torch.Tensor] = {}
        for place, index in enumerate(chosen):
            self._tap(layers[index], (place, "states"))
            for name, module in zip(("query", "key", "value"), _projections(layers[index]) if projections else ()):
                self._tap(module, (place, name))

    def _tap(self, module: nn.Module, key: tuple[int, str]) -> None:
        module.register_forward_hook(lambda _module, _inputs, out: self.seen.__setitem__(
            key, (out[0] if isinstance(out, tuple) else out).float()))

    def states(self) -> list[torch.Tensor]:
        return [tensor for (_, kind), tensor in sorted(self.seen.items()) if kind == "states"]

    def projections(self) -> list[torch.Tensor]:
        """Each layer's queries, keys and values, layer by layer."""
        return [tensor for (_, kind), tensor in sorted(self.seen.items()) if kind != "states"]


def _projections(layer: nn.Module) -> list[nn.Module]:
    """The layer's query, key and value projections (PROJECTION_PATHS), or why it cannot be distilled."""
    for paths in PROJECTION_PATHS:
        try:
            return [layer.get_submodule(path) for path in paths]
        except AttributeError:
            continue
    raise OptimizeError(f"cannot distil this model: its encoder layers have no self-attention projections "
                        f"({' or '.join(paths[0] for paths in PROJECTION_PATHS)})",
                        hint="distillation supports BERT-like encoders (BERT, MiniLM, RoBERTa, DistilBERT); "
                        "optimise the teacher without distilling")


def variant(text: str, rng: random.Random) -> str:
    """The text a little changed, for the teacher to teach on: either about 15% of its words dropped, or a run of 50 to
    90% of them kept. A text of fewer than four words (or in a script without spaces) stays as it is."""
    words = text.split()
    if len(words) < 4:
        return text
    if rng.random() < 0.5:
        return " ".join(word for word in words if rng.random() >= 0.15) or text
    size = max(3, int(len(words) * rng.uniform(0.5, 0.9)))
    start = rng.randrange(len(words) - size + 1)
    return " ".join(words[start : start + size])


def _batches(texts: Sequence[str], indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]:
    """Batches of similar length in random order; lengths are jittered so the batches differ each epoch."""
    jitter = (0.8 + 0.4 * torch.rand(len(indices), generator=generator)).tolist()
    order = [i for _, i in sorted(zip((len(texts[i]) * j for i, j in zip(indices, jitter)), indices))]
    batches = [order[start : start + size] for start in range(0, len(order), size)]
    return [batches[b] for b in torch.randperm(len(batches), generator=generator).tolist()]


def _layers_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor],
                 attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean squared distance of each student layer's token states to its teacher layer's (padding left out),
    averaged over the layers."""
    keep = attention_mask[:, :, None].to(torch.float32)
    pairs = list(zip(student, teacher, strict=True))
    return sum(((s - t) ** 2 * keep).sum() / (keep.sum() * s.shape[-1]) for s, t in pairs) / len(pairs)


def _relations_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor], attention_mask: torch.Tensor,
                    heads: int) -> torch.Tensor:
    """KL(teacher || student) of the self-attention relations of each pair of projections (the tokens of a text
    only, padding left out), averaged over heads, tokens and pairs."""
    pairs = list(zip(student, teacher, strict=True))
    tokens = attention_mask[:, None, :].to(torch.float32)  # (batch, 1, tokens): a padding token's row counts for 0
    total = sum((nn.functional.kl_div(_relation(s, heads, attention_mask), _relation(t, heads, attention_mask),
                                      log_target=True, reduction="none").sum(-1) * tokens).sum()
                for s, t in pairs)
    return total / (tokens.sum() * heads * len(pairs))


def _relation(projected: torch.Tensor, heads: int, attention_mask: torch.Tensor) -> torch.Tensor:
    """Per head, the log-softmax over a text's tokens of each token's scaled dot product with every other token."""
    batch, length, width = projected.shape
    split = projected.view(batch, length, heads, width // heads).transpose(1, 2)
    scores = split @ split.transpose(-1, -2) / math.sqrt(width // heads)
    # A large finite fill, not -inf: padding keys get a probability of exactly 0 without a 0 * inf in the KL.
    return nn.functional.log_softmax(scores.masked_fill(attention_mask[:, None, None, :] == 0, -1e9), dim=-1)


def _loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, params: DistillParams) -> torch.Tensor:
    """alpha * T^2 * KL(teacher || student) at temperature T, plus (1 - alpha) * cross-entropy on the labels (summed
    over the texts that have one, NO_LABEL for a variant, over the batch's size)."""
    t = params.temperature
    soft = nn.functional.kl_div(nn.functional.log_softmax(student / t, dim=-1),
                                nn.functional.log_softmax(teacher / t, dim=-1), log_target=True, reduction="batchmean")
    hard = nn.functional.cross_entropy(student, labels, ignore_index=NO_LABEL, reduction="sum") / len(labels)
    return params.alpha * t * t * soft + (1 - params.alpha) * hard
