"""What this server can do, and how a training job should use it.

detect() reads the CPU, memory, CUDA GPUs and OpenVINO devices and never fails: what
cannot be read becomes an unknown and a note. plan() turns that and a job (model shape,
sequence length, batch) into a device, a precision and a micro-batch that fits memory.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from appliance.core.errors import PlanError
from appliance.core.text import counted

if TYPE_CHECKING:
    import openvino

CPUINFO = Path("/proc/cpuinfo")
# The ISA extensions that change which precision trains fastest, as /proc/cpuinfo names them.
TRAINING_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
# oneDNN, inside torch and OpenVINO, uses no instruction beyond this variable's level: the planner must not either.
ISA_CAP = "ONEDNN_MAX_CPU_ISA"
_AVX2 = ("avx2",)
_AVX512 = (*_AVX2, "avx512f")
_AVX512_BF16 = (*_AVX512, "avx512_vnni", "avx512_bf16")
_AMX = (*_AVX512_BF16, "amx_tile", "amx_bf16", "amx_int8")
# The TRAINING_FLAGS each of oneDNN's levels leaves usable (its names, aliases included); ALL and DEFAULT cap nothing.
ISA_LEVELS: dict[str, tuple[str, ...]] = {
    "SSE41": (), "AVX": (), "AVX2": _AVX2, "AVX2_VNNI": (*_AVX2, "avx_vnni"), "AVX2_VNNI_2": (*_AVX2, "avx_vnni"),
    "AVX512_CORE": _AVX512, "AVX512_CORE_VNNI": (*_AVX512, "avx512_vnni"), "AVX512_CORE_BF16": _AVX512_BF16,
    "AVX10_1_512": _AVX512_BF16, "AVX512_CORE_FP16": _AVX512_BF16,
    "AVX10_1_512_AMX": _AMX, "AVX512_CORE_AMX": _AMX, "AVX10_1_512_AMX_FP16": _AMX, "AVX512_CORE_AMX_FP16": _AMX,
}
MiB = 2**20


@dataclass(frozen=True)
class Cpu:
    model: str  # "unknown" when /proc/cpuinfo cannot be read
    physical_cores: int
    logical_cores: int
    flags: tuple[str, ...]  # those of TRAINING_FLAGS this CPU has, and the libraries may use
    isa_cap: str | None = None  # the ISA_CAP level that hides the rest of them, if one is set
    family: str = ""  # "family 25, model 17": what tells apart CPUs a VM names alike ("AMD EPYC")

    @property
    def name(self) -> str:
        """The model, with its family and model numbers where the kernel gives them."""
        return f"{self.model} ({self.family})" if self.family else self.model

    def described(self) -> str:
        """The CPU as a benchmark's figures name it: what it is, its cores and the flags that set the speed."""
        return (f"{self.name}, {self.physical_cores} physical / {self.logical_cores} logical cores, flags "
                f"{' '.join(self.flags) or 'none'}" + (f" (capped: {ISA_CAP}={self.isa_cap})" if self.isa_cap else ""))

    @property
    def fast_bf16(self) -> bool:
        """Whether bf16 matrix work runs natively (AMX or AVX-512 BF16) rather than emulated."""
        return "amx_bf16" in self.flags or "avx512_bf16" in self.flags

    @property
    def fast_int8(self) -> bool:
        """Whether int8 dot products run natively (VNNI, AMX), summed in int32 rather than in saturating int16."""
        return any(flag in self.flags for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total_bytes: int
    compute_capability: str  # "8.0"
    bf16: bool  # native bf16, not emulated


@dataclass(frozen=True)
class OpenVinoDevice:
    name: str  # "CPU", "GPU.0", "NPU"
    full_name: str


@dataclass(frozen=True)
class Hardware:
    cpu: Cpu
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: tuple[Gpu, ...]
    openvino_devices: tuple[OpenVinoDevice, ...]
    notes: tuple[str, ...]  # what could not be detected, and why


def detect() -> Hardware:
    """Describe this machine; a missing file, driver or runtime becomes a note, never an error."""
    notes: list[str] = []
    memory = psutil.virtual_memory()
    return Hardware(
        cpu=detect_cpu(notes),
        ram_total_bytes=memory.total,
        ram_available_bytes=memory.available,
        gpus=_gpus(notes),
        openvino_devices=_openvino_devices(notes),
        notes=tuple(notes),
    )


def detect_cpu(notes: list[str] | None = None) -> Cpu:
    """This CPU as torch and OpenVINO may use it: its flags, less those an ISA_CAP in the environment rules out."""
    notes = [] if notes is None else notes
    fields: dict[str, str] = {}
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first processor speaks for all
    except OSError as exc:
        notes.append(f"CPU model and flags unknown: cannot read {CPUINFO} ({exc.strerror})")
    present = set(fields.get("flags", "").split())
    cap = _isa_cap(notes)
    if cap is not None:
        hidden = [flag for flag in TRAINING_FLAGS if flag in present and flag not in ISA_LEVELS[cap]]
        notes.append(f"{ISA_CAP}={cap}: oneDNN, in torch and OpenVINO, uses no instruction beyond it, nor does the plan"
                     + (f" ({', '.join(hidden)} unused)" if hidden else ""))
        present &= set(ISA_LEVELS[cap])
    logical = psutil.cpu_count(logical=True) or 1
    return Cpu(
        model=fields.get("model name", "unknown"),
        physical_cores=psutil.cpu_count(logical=False) or logical,
        logical_cores=logical,
        flags=tuple(flag for flag in TRAINING_FLAGS if flag in present),
        isa_cap=cap,
        family=f"family {fields['cpu family']}, model {fields['model']}" if "cpu family" in fields and "model" in fields
        else "",
    )


def _isa_cap(notes: list[str]) -> str | None:
    """The level ISA_CAP sets, upper-cased as oneDNN reads it; None when unset, ALL, DEFAULT or not a level."""
    value = os.environ.get(ISA_CAP, "").strip().upper()
    if value in ("", "ALL", "DEFAULT"):
        return None
    if value not in ISA_LEVELS:
        notes.append(f"{ISA_CAP}={value} is not a oneDNN ISA level ({', '.join(ISA_LEVELS)}): ignored, as oneDNN does")
        return None
    return value


def _gpus(notes: list[str]) -> tuple[Gpu, ...]:
    try:
        import torch  # here, not at the top: every CLI command imports this module

        if not torch.cuda.is_available():
            return ()
        found = []
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            with torch.cuda.device(index):
                bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
            capability = f"{properties.major}.{properties.minor}"
            found.append(Gpu(index, properties.name, properties.total_memory, capability, bf16))
        return tuple(found)
    except (ImportError, OSError, RuntimeError, AssertionError) as exc:  # a broken driver leaves the CPU
        notes.append(f"CUDA devices unknown: {type(exc).__name__}: {exc}")
        return ()


def _openvino_devices(notes: list[str]) -> tuple[OpenVinoDevice, ...]:
    try:
        import openvino

        core = openvino.Core()
        return tuple(OpenVinoDevice(name, _full_name(core, name)) for name in core.available_devices)
    except (ImportError, OSError, RuntimeError) as exc:  # a missing plugin costs the runtime, not the report
        notes.append(f"OpenVINO devices unknown: {type(exc).__name__}: {exc}")
        return ()


def _full_name(core: openvino.Core, device: str) -> str:
    try:
        return str(core.get_property(device, "FULL_DEVICE_NAME"))
    except RuntimeError:  # one plugin failing to describe itself leaves the others listed
        return "unknown"


@dataclass(frozen=True)
class ModelShape:
    parameters: int  # total
    trainable_parameters: int  # e.g. fewer with LoRA
    hidden_size: int
    layers: int
    heads: int
    intermediate_size: int
    vocab_size: int


# Config keys of BERT-like models, with DistilBERT's names as the alternatives.
_CONFIG_KEYS = {
    "hidden_size": ("hidden_size", "dim"),
    "layers": ("num_hidden_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_heads"),
    "intermediate_size": ("intermediate_size", "hidden_dim"),
    "vocab_size": ("vocab_size",),
}


def model_shape(model_dir: Path) -> ModelShape:
    """Read a model's size from config.json and the weight files' headers, without loading any weights."""
    config = _model_config(model_dir)
    sizes: dict[str, int] = {}
    for field, keys in _CONFIG_KEYS.items():
        value = next((config[key] for key in keys if isinstance(config.get(key), int)), None)
        if value is None:
            raise PlanError(f"{model_dir / 'config.json'} has no integer {keys[0]}; is it a BERT-like encoder?")
        sizes[field] = value
    parameters = _parameter_count(model_dir, config)
    return ModelShape(parameters=parameters, trainable_parameters=parameters, **sizes)


def max_positions(model_dir: Path) -> int:
    """The longest input, in tokens, that the model's position embeddings allow."""
    config = _model_config(model_dir)
    value = next((config[key] for key in ("max_position_embeddings", "n_positions") if isinstance(config.get(key), int)),
                 None)
    return value or 512


def _model_config(model_dir: Path) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise PlanError(f"base model directory {model_dir} does not exist")
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError as exc:
        raise PlanError(
            f"{model_dir} has no config.json, so it is not a Hugging Face model directory",
            hint="give a local directory holding config.json, the tokenizer and the weights",
        ) from exc
    except (OSError, ValueError) as exc:
        raise PlanError(f"cannot read {model_dir / 'config.json'}: {exc}") from exc
    if not isinstance(config, dict):
        raise PlanError(f"{model_dir / 'config.json'} is not a JSON object")
    return config


def _parameter_count(model_dir: Path, config: dict[str, object]) -> int:
    """Count parameters from safetensors headers, or from .bin sizes when there are none."""
    count = sum(_safetensors_parameters(path) for path in sorted(model_dir.glob("*.safetensors")))
    if count:
        return count
    bytes_per_value = 2 if config.get("torch_dtype") in ("float16", "bfloat16") else 4
    count = sum(path.stat().st_size for path in model_dir.glob("pytorch_model*.bin")) // bytes_per_value
    if not count:
        raise PlanError(f"{model_dir} has no model.safetensors or pytorch_model.bin weights")
    return count


def _safetensors_parameters(path: Path) -> int:
    # A safetensors file starts with an 8-byte little-endian header length, then a JSON header.
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        return sum(
            math.prod(tensor["shape"])
            for name, tensor in header.items()
            if name != "__metadata__" and tensor["dtype"].startswith(("F", "BF"))  # not integer buffers
        )
    except (OSError, ValueError, struct.error, AttributeError, KeyError, TypeError) as exc:
        raise PlanError(f"{path} is not a readable safetensors file: {exc!r}") from exc


@dataclass(frozen=True)
class JobRequest:
    shape: ModelShape
    seq_len: int
    effective_batch: int
    device: str | None = None  # "cpu", "cuda", or None = best available
    num_labels: int = 2
    workers: int | None = None  # data-parallel processes; None: one per GPU (one on a CPU)
    placed: bool = False  # the workers already run where a cluster put them: not checked against this machine


@dataclass(frozen=True)
class TrainingPlan:
    device: str  # "cpu" or "cuda:0"
    precision: str  # "fp32" | "bf16" | "fp16"
    grad_scaler: bool  # True only for fp16 on CUDA
    threads: int  # torch.set_num_threads value
    micro_batch: int
    accumulation: int  # micro_batch * accumulation >= effective_batch, as close as possible
    effective_batch: int
    seq_len: int
    estimated_peak_bytes: int
    budget_bytes: int  # memory the plan allows itself
    notes: tuple[str, ...]  # why this precision, why the batch was split, ...
    workers: int = 1  # data-parallel processes, each with micro_batch x accumulation of the batch and its threads


# The estimate is calibrated on the peak RSS of three AdamW steps of all-MiniLM-L6-v2 for sequence
# classification (22.7M parameters, 6 layers, hidden 384, intermediate 1536, 12 heads, sdpa attention)
# under torch 2.13 on a 2-core AVX-512 CPU. Measured / estimated MiB, batch x sequence length:
#   fp32 32x128: 2291 / 2263    fp32 8x128: 1237 / 1210    fp32 64x64: 2057 / 2029
#   fp32 16x256: 2592 / 2731    fp32 4x512: 2146 / 2263
#   bf16 32x128: 1908 / 1838    bf16 8x128: 1156 / 1136    bf16 16x256: 2389 / 2306
# (bf16 also ran 1.5x faster there: 1.3 s against 1.9 s per step of 32x128.)
OVERHEAD_BYTES = 512 * MiB  # CPU: torch and transformers imported (400 MiB RSS) plus loading the weights;
# on CUDA the context and cuBLAS workspaces take about as much GPU memory.
WEIGHT_BYTES = 4  # per parameter: fp32 master weights, also under autocast
AUTOCAST_CACHE_BYTES = 2  # per parameter: autocast keeps a half-precision copy of each weight for the step
TRAINABLE_BYTES = 4 + 8  # per trainable parameter: its gradient, and AdamW's two moments
# Activations kept for backward, per layer and token (Korthikanti et al. 2022, "Reducing Activation
# Recomputation in Large Transformer Models", counted again for eager PyTorch):
HIDDEN_VALUES = 18  # hidden-wide values: Q, K, V, context, projections, residuals, LayerNorm and dropout;
# the paper counts about 9 of them, PyTorch keeps about twice that (fitted to the measurements above).
INTERMEDIATE_VALUES = 2  # intermediate-wide values: the MLP's input to GELU and its output
ATTENTION_BYTES = 13  # per head and key position: the probabilities and their dropout output (fp32
# even under autocast, as softmax runs in fp32) and the dropout mask, plus allocator slack (fitted).
# Fused attention on CUDA keeps no probabilities, so there the estimate errs on the safe side.
BUDGET_SHARE = {"cpu": 0.8, "cuda": 0.9}  # of available RAM, and of the GPU's total memory


def estimate_peak_bytes(shape: ModelShape, micro_batch: int, seq_len: int, precision: str) -> int:
    """Estimate one training step's peak memory, so a plan can pick a micro-batch that fits."""
    half = precision in ("bf16", "fp16")
    weights = shape.parameters * (WEIGHT_BYTES + (AUTOCAST_CACHE_BYTES if half else 0))
    value_bytes = 2 if half else 4
    per_token = (HIDDEN_VALUES * shape.hidden_size + INTERMEDIATE_VALUES * shape.intermediate_size) * value_bytes
    per_token += ATTENTION_BYTES * shape.heads * seq_len
    activations = shape.layers * micro_batch * seq_len * per_token
    return OVERHEAD_BYTES + weights + shape.trainable_parameters * TRAINABLE_BYTES + activations


def plan(hardware: Hardware, request: JobRequest) -> TrainingPlan:
    """Choose the device, precision, threads and the largest micro-batch whose estimated peak fits."""
    if request.effective_batch < 1 or request.seq_len < 1:
        raise PlanError(f"batch {request.effective_batch} and sequence length {request.seq_len} must be positive")
    gpu = training_gpu(hardware, request.device)
    device = f"cuda:{gpu.index}" if gpu else "cpu"
    precision, precision_note = training_precision(hardware.cpu, gpu)
    if gpu:
        budget = int(gpu.total_bytes * BUDGET_SHARE["cuda"])
        budget_note = f"memory budget {format_bytes(budget)}: 90% of {gpu.name}'s {format_bytes(gpu.total_bytes)}"
    else:
        budget = int(hardware.ram_available_bytes * BUDGET_SHARE["cpu"])
        budget_note = f"memory budget {format_bytes(budget)}: 80% of the RAM available now"
    head = (request.shape.hidden_size + 1) * request.num_labels  # the classifier the job adds
    shape = replace(
        request.shape,
        parameters=request.shape.parameters + head,
        trainable_parameters=request.shape.trainable_parameters + head,
    )
    workers = request.workers if request.placed and request.workers else _workers(hardware, gpu, request.workers)
    effective = math.ceil(request.effective_batch / workers)  # each worker's share of the batch
    micro = effective
    while (estimate := estimate_peak_bytes(shape, micro, request.seq_len, precision)) > budget:
        if micro == 1:
            raise PlanError(
                f"training needs about {format_bytes(estimate)} even one example at a time at sequence length "
                f"{request.seq_len}, but the budget on {device} is {format_bytes(budget)}",
                hint="use a shorter --max-length, train LoRA adapters (--lora), or a smaller base model (--base)",
            )
        micro //= 2
    accumulation = math.ceil(effective / micro)
    micro = math.ceil(effective / accumulation)  # spread evenly: 9 as 3 x 3, not 4 x 3
    threads = max(1, hardware.cpu.physical_cores // workers)
    notes = [precision_note, f"{counted(threads, 'thread')}: one per physical core"
             + (f", {workers} workers sharing them" if workers > 1 else ""), budget_note]
    if workers > 1:
        notes.append(f"data-parallel over {workers} {'GPUs' if gpu else 'processes'}: each takes {effective} of"
                     f" the batch of {request.effective_batch}" + ("" if gpu else "; on one CPU they share its cores,"
                     " which is usually slower than one process: data-parallel pays off over GPUs or machines"))
    if micro < effective:
        full = estimate_peak_bytes(shape, effective, request.seq_len, precision)
        notes.append(
            f"micro-batch {micro} x {accumulation} accumulation steps: the whole batch of {effective} "
            f"would need about {format_bytes(full)}"
        )
    return TrainingPlan(
        device=device,
        precision=precision,
        grad_scaler=precision == "fp16",
        threads=threads,
        micro_batch=micro,
        accumulation=accumulation,
        effective_batch=request.effective_batch,
        seq_len=request.seq_len,
        estimated_peak_bytes=estimate_peak_bytes(shape, micro, request.seq_len, precision),
        budget_bytes=budget,
        notes=tuple(notes),
        workers=workers,
    )


def _workers(hardware: Hardware, gpu: Gpu | None, wanted: int | None) -> int:
    """One process per GPU from the one chosen on (or as many as asked for); one on a CPU unless asked for more."""
    available = len(hardware.gpus) - hardware.gpus.index(gpu) if gpu else max(1, hardware.cpu.physical_cores)
    if wanted is None:
        return available if gpu else 1
    if wanted > available:
        where = f"{available} GPUs" if gpu else f"{counted(available, 'physical core')}"
        raise PlanError(f"{wanted} data-parallel workers were asked for, but this machine has {where}",
                        hint=f"ask for {available} or fewer workers")
    return wanted


def training_gpu(hardware: Hardware, wanted: str | None = None) -> Gpu | None:
    """The GPU a run trains on (the first; `wanted` "cpu": none), or a PlanError for a device it cannot have."""
    if wanted not in (None, "cpu", "cuda"):
        raise PlanError(f"unknown training device {wanted!r}", hint="use cpu or cuda, or leave it unset")
    if wanted == "cuda" and not hardware.gpus:
        raise PlanError("training on CUDA was asked for, but torch sees no CUDA device", hint="train on the cpu")
    return hardware.gpus[0] if hardware.gpus and wanted != "cpu" else None


def training_precision(cpu: Cpu, gpu: Gpu | None) -> tuple[str, str]:
    """The autocast a run trains in on that GPU (None: the CPU), "bf16", "fp16" or "fp32", and why, in words."""
    if gpu and gpu.bf16:
        return "bf16", f"bf16 autocast: {gpu.name} computes in bf16 natively"
    if gpu:
        return "fp16", (
            f"fp16 autocast with a gradient scaler: {gpu.name} (compute capability "
            f"{gpu.compute_capability}) has no native bf16"
        )
    if cpu.fast_bf16:
        native = "AMX" if "amx_bf16" in cpu.flags else "AVX-512 BF16"
        return "bf16", f"bf16 autocast: the CPU has {native}"
    lacks = f"{ISA_CAP}={cpu.isa_cap} leaves" if cpu.isa_cap else "the CPU has"
    return "fp32", f"fp32: {lacks} neither AMX nor AVX-512 BF16, so bf16 would be emulated and slower"


def format_bytes(count: int) -> str:
    """Bytes as an operator reads them: MiB below a GiB, GiB from there."""
    return f"{count / MiB:.0f} MiB" if count < 2**30 else f"{count / 2**30:.1f} GiB"
