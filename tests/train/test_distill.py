"""Distillation of a tiny 2-layer teacher into a 1-layer student, with real torch and real optimisation."""

from __future__ import annotations

import json
import random
from copy import deepcopy
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load as load_safetensors

from appliance import inference, optimize
from appliance.core import archive, hardware
from appliance.core.errors import JobInterrupted, OptimizeError
from appliance.data import datasets
from appliance.train import distill
from appliance.train.bundle import input_names, load_text_classifier
from tests.conftest import Trained

MAX_LENGTH = 32
CHANCE = 1 / 3  # three balanced classes
# A 32-wide model wants a high rate; min_steps=0: the epochs as given, however few steps they make; one variant.
FAST = distill.DistillParams(layers=1, epochs=3, learning_rate=2e-3, batch_size=16, min_steps=0, variants=1)


@pytest.fixture(scope="module")
def teacher(trained: Trained) -> tuple[bytes, datasets.LoadedDataset]:
    return trained.bundle, trained.data


@pytest.fixture(scope="module")
def student(teacher: tuple[bytes, datasets.LoadedDataset]) -> distill.Student:
    return distill.distill(*teacher, FAST)


def test_a_one_layer_student_keeps_the_teachers_accuracy_and_is_smaller(
    teacher: tuple[bytes, datasets.LoadedDataset], student: distill.Student
) -> None:
    teacher_files, student_files = archive.unpack(teacher[0]), archive.unpack(student.bundle)
    assert student.teacher_metrics["accuracy"] > 0.9
    assert student.metrics["accuracy"] >= student.teacher_metrics["accuracy"] - 0.1, student
    assert set(student.metrics) == {"accuracy", "macro_f1"} and student.layers == 1 and student.seconds > 0
    assert student.epochs == FAST.epochs
    assert set(student_files) == set(teacher_files)
    assert json.loads(student_files["config.json"])["num_hidden_layers"] == 1
    assert student_files["appliance.json"] == teacher_files["appliance.json"]

    def parameters(files: dict[str, bytes]) -> int:
        return sum(t.numel() for t in load_safetensors(files["model.safetensors"]).values())

    assert parameters(student_files) < parameters(teacher_files)
    assert len(student_files["model.safetensors"]) < len(teacher_files["model.safetensors"])
    assert not any(".layer.1." in name for name in load_safetensors(student_files["model.safetensors"]))


def test_on_a_cpu_with_native_bf16_the_student_is_taught_in_bf16_and_stored_in_fp32(
    teacher: tuple[bytes, datasets.LoadedDataset],
) -> None:
    """bf16 autocast where the CPU has AMX or AVX-512 BF16, as training plans it (elsewhere it would be emulated):
    the student learns as in fp32, its stored weights stay fp32, and its description says how it was taught."""
    def cpu(*flags: str) -> hardware.Cpu:
        return hardware.Cpu(model="test CPU", physical_cores=2, logical_cores=2, flags=flags)

    assert distill.precision_for(cpu("avx2", "amx_bf16")) == distill.precision_for(cpu("avx512_bf16")) == torch.bfloat16
    assert distill.precision_for(cpu("avx2", "avx512f", "avx512_vnni")) is None
    student = distill.distill(*teacher, FAST, precision=torch.bfloat16)
    assert student.metrics["accuracy"] >= student.teacher_metrics["accuracy"] - 0.1, student
    weights = load_safetensors(archive.unpack(student.bundle)["model.safetensors"])
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}
    assert f"{FAST.epochs} epochs in bfloat16 autocast at lr" in student.describe()


def test_a_box_with_a_cuda_gpu_distils_on_it_as_training_would() -> None:
    """Placed as a training run is: the first GPU, in bf16 where it computes it natively, else fp16 (with a gradient
    scaler); without one, the CPU in its own precision."""
    def machine(*gpus: hardware.Gpu, flags: tuple[str, ...] = ("avx2",)) -> hardware.Hardware:
        return hardware.Hardware(cpu=hardware.Cpu(model="test CPU", physical_cores=2, logical_cores=2, flags=flags),
                                 ram_total_bytes=2**34, ram_available_bytes=2**33, gpus=gpus, openvino_devices=(),
                                 notes=())

    def gpu(index: int, bf16: bool) -> hardware.Gpu:
        return hardware.Gpu(index=index, name="test GPU", total_bytes=2**34, compute_capability="8.0", bf16=bf16)

    assert distill.placed(machine(gpu(0, True), gpu(1, False))) == (torch.device("cuda:0"), torch.bfloat16)
    assert distill.placed(machine(gpu(0, False))) == (torch.device("cuda:0"), torch.float16)
    assert distill.placed(machine(flags=("avx2", "amx_bf16"))) == (torch.device("cpu"), torch.bfloat16)
    assert distill.placed(machine()) == (torch.device("cpu"), None)


def test_in_fp16_with_its_gradient_scaler_the_student_learns_and_is_stored_in_fp32(
    teacher: tuple[bytes, datasets.LoadedDataset],
) -> None:
    """fp16 is a GPU's precision where it lacks native bf16; its passes and its gradient scaler run on the CPU too, so
    that path runs on every box, not only on a GPU."""
    student = distill.distill(*teacher, replace(FAST, epochs=2), precision=torch.float16)
    assert student.metrics["accuracy"] >= student.teacher_metrics["accuracy"] - 0.1, student
    assert " epochs in float16 autocast at lr" in student.describe() and " on " not in student.describe()
    weights = load_safetensors(archive.unpack(student.bundle)["model.safetensors"])
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", [torch.bfloat16, torch.float16])
def test_on_a_gpu_the_student_is_taught_there_and_stored_from_host_memory(
    teacher: tuple[bytes, datasets.LoadedDataset], precision: torch.dtype
) -> None:
    student = distill.distill(*teacher, FAST, device=torch.device("cuda:0"), precision=precision)
    assert student.metrics["accuracy"] >= student.teacher_metrics["accuracy"] - 0.1, student
    assert student.device == "cuda:0" and " on cuda:0 at lr" in student.describe()
    model, _reader, _manifest = load_text_classifier(archive.unpack(student.bundle))
    assert {parameter.device.type for parameter in model.parameters()} == {"cpu"}


def test_the_student_bundle_loads_and_optimises_like_a_trained_one(
    teacher: tuple[bytes, datasets.LoadedDataset], student: distill.Student
) -> None:
    data = teacher[1]
    model, _, manifest = load_text_classifier(archive.unpack(student.bundle))
    assert len(model.base_model.encoder.layer) == 1 and manifest["labels"] == data.label_names
    machine = hardware.Hardware(cpu=hardware.Cpu(model="test CPU", physical_cores=2, logical_cores=2, flags=()),
                                ram_total_bytes=2**33, ram_available_bytes=2**32, gpus=(), openvino_devices=(), notes=())
    outcome = optimize.optimize(
        student.bundle,
        calibration=[data.texts[i] for i in data.train],
        examples=[data.texts[i] for i in data.validation],
        labels=[data.labels[i] for i in data.validation],
        hardware=machine,
        max_accuracy_drop=-1.0,  # impossible, so every INT8 variant is built and scored
        subset_size=64,
    )
    assert set(outcome.artifacts) == {"fp32", "int8", "int8-gentle"}
    assert len(outcome.artifacts["int8"].weights) < len(outcome.artifacts["fp32"].weights) / 2
    assert outcome.decision.scores["int8"]["accuracy"] > CHANCE + 0.3
    assert outcome.decision.scores["fp32"]["accuracy"] == pytest.approx(student.metrics["accuracy"], abs=0.05)


def test_a_narrower_student_keeps_the_width_asked_and_its_teachers_accuracy_and_optimises(
    teacher: tuple[bytes, datasets.LoadedDataset],
) -> None:
    bundle, data = teacher
    narrow = distill.distill(bundle, data, replace(FAST, width=16))  # of the teacher's 64 units a feed-forward block
    files = archive.unpack(narrow.bundle)
    assert json.loads(files["config.json"])["intermediate_size"] == 16
    shapes = {name.split("layer.0.")[-1]: tuple(weight.shape)
              for name, weight in load_safetensors(files["model.safetensors"]).items() if "layer.0." in name}
    assert shapes["intermediate.dense.weight"] == (16, 32) and shapes["output.dense.weight"] == (32, 16)
    assert narrow.metrics["accuracy"] >= narrow.teacher_metrics["accuracy"] - 0.1, narrow
    assert narrow.describe().startswith("1-layer, 16-wide student, 3 epochs")
    fp32, reader, manifest = optimize.export_bundle(files)
    served = inference.evaluate(inference.compile_openvino(fp32), reader, [data.texts[i] for i in data.validation],
                                [manifest["labels"].index(data.labels[i]) for i in data.validation])
    assert served["accuracy"] == pytest.approx(narrow.metrics["accuracy"], abs=0.05)


AVX2_ONLY = hardware.Cpu("AMD EPYC", 2, 2, ("avx2",))
AMX = hardware.Cpu("Intel Xeon", 2, 2, ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"))
MINILM = {"model_type": "bert", "num_hidden_layers": 6, "intermediate_size": 1536}


def test_a_student_left_unshaped_is_sized_for_the_cpu_it_will_serve_on() -> None:
    """Half the teacher's layers; narrower too where neither bf16 nor int8 runs natively; what is asked is kept."""
    narrow, why = distill.sized_for(MINILM, AVX2_ONLY)
    assert (narrow.layers, narrow.width) == (3, 1024)
    assert why == ("half the teacher's 6 layers, 1,024 of their 1,536 feed-forward units: this CPU computes neither "
                   "bf16 nor int8 natively (no AMX, AVX-512 BF16 or VNNI), so a narrower student for speed")
    full, why = distill.sized_for(MINILM, AMX)
    assert (full.layers, full.width) == (3, None) and why.endswith("all their feed-forward units: this CPU computes "
                                                                   "bf16 or int8 natively")
    vnni_only = hardware.Cpu("Intel Core", 4, 8, ("avx2", "avx_vnni"))
    assert distill.sized_for(MINILM, vnni_only)[0].width is None
    distilbert = {"model_type": "distilbert", "n_layers": 6, "hidden_dim": 3072}
    assert distill.sized_for(distilbert, AVX2_ONLY)[0].shape == "3-layer, 2048-wide"
    assert distill.sized_for(MINILM, AVX2_ONLY, layers=2) == (distill.DistillParams(layers=2), "")  # full width, as asked
    assert distill.sized_for(MINILM, AVX2_ONLY, width=768) == (distill.DistillParams(layers=3, width=768),
                                                               "half the teacher's 6 layers")
    with pytest.raises(OptimizeError, match="its config gives None encoder layers"):
        distill.sized_for({"model_type": "mystery"}, AMX)
    with pytest.raises(OptimizeError, match="can keep from 1 to 1535 of the teacher's 1536 units, not 2048"):
        distill.sized_for(MINILM, AMX, width=2048)
    with pytest.raises(OptimizeError, match="keep from 1 to 5 of the teacher's 6 encoder layers, not 6"):
        distill.sized_for(MINILM, AMX, layers=6)


def test_narrowing_drops_the_units_that_pass_on_least_and_moves_what_they_passed_on_into_the_bias() -> None:
    """Units that pass on nothing (no output weights) or the same for every token (no input weights) are the least
    used; dropping them leaves every output as it was, the constant ones' share moved into the bias."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=16)).eval()
    block = model.encoder.layer[0]
    with torch.no_grad():
        block.intermediate.dense.weight[:48] *= 10  # the used units: 0 to 47
        block.output.dense.weight[:, 48:56] = 0  # these pass on nothing
        block.intermediate.dense.weight[56:] = 0  # and these pass on GELU(0.01) whatever the token
        block.intermediate.dense.bias[56:] = 0.01
    feeds = [{"input_ids": torch.randint(1, 100, (4, 12)).numpy(), "attention_mask": torch.ones(4, 12).long().numpy()}
             for _ in range(3)]
    before = [model(**{name: torch.from_numpy(array) for name, array in feed.items()}).last_hidden_state
              for feed in feeds]
    distill._narrow(model, model.encoder.layer, 48, feeds)
    assert model.config.intermediate_size == 48 and block.intermediate.dense.weight.shape == (48, 32)
    for feed, expected in zip(feeds, before):
        after = model(**{name: torch.from_numpy(array) for name, array in feed.items()}).last_hidden_state
        torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-4)


def test_narrowing_chooses_by_the_texts_tokens_not_by_their_padding() -> None:
    """The same texts in batches padded longer choose the same units and fold the same means into the bias: what the
    layers compute on padding (which no output reads) does not count."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=32)).eval()
    ids = [torch.randint(1, 100, (4, 12)) for _ in range(3)]
    tight = [{"input_ids": batch.numpy(), "attention_mask": torch.ones(4, 12).long().numpy()} for batch in ids]
    padded = [{"input_ids": torch.cat([batch, torch.zeros(4, 20, dtype=torch.long)], 1).numpy(),
               "attention_mask": torch.cat([torch.ones(4, 12), torch.zeros(4, 20)], 1).long().numpy()}
              for batch in ids]
    narrowed = []
    for feeds in (tight, padded):
        student = deepcopy(model)
        distill._narrow(student, student.encoder.layer, 40, feeds)
        narrowed.append(student.state_dict())
    for name, tensor in narrowed[0].items():
        torch.testing.assert_close(narrowed[1][name], tensor, atol=1e-5, rtol=1e-4, msg=name)


def test_the_student_learns_from_the_teachers_soft_labels(teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    bundle, data = teacher
    train = set(data.train)
    untrained = distill.distill(bundle, data, replace(FAST, epochs=1, learning_rate=0))
    # Every training label is wrong: only the teacher can show the student the classes.
    mislabelled = datasets.LoadedDataset(None, [data.label_names[0] if i in train else label  # type: ignore[arg-type]
                                                for i, label in enumerate(data.labels)],
                                         data.label_names, data.train, data.validation, data.texts)
    logits_only = replace(FAST, hidden_weight=0.0)  # the layers' pull would teach the classes too
    soft_only = distill.distill(bundle, mislabelled, replace(logits_only, alpha=1.0))
    hard_only = distill.distill(bundle, mislabelled, replace(logits_only, alpha=0.0))
    assert untrained.metrics["accuracy"] < soft_only.teacher_metrics["accuracy"] - 0.1  # so there was something to learn
    assert soft_only.metrics["accuracy"] >= soft_only.teacher_metrics["accuracy"] - 0.05, soft_only.metrics
    assert hard_only.metrics["accuracy"] < CHANCE + 0.1, hard_only.metrics  # and alpha weighs the two losses


def test_the_students_layers_are_drawn_towards_the_teachers_states(
    teacher: tuple[bytes, datasets.LoadedDataset], student: distill.Student
) -> None:
    bundle, data = teacher
    texts = [data.texts[i] for i in data.validation]

    def last_states(bundle: bytes) -> torch.Tensor:
        model, reader, _ = load_text_classifier(archive.unpack(bundle))
        feeds = inference.encode(reader, texts, input_names(model))
        with torch.no_grad():
            states = model.base_model(**{name: torch.from_numpy(array) for name, array in feeds.items()})[0]
        return states * torch.from_numpy(feeds["attention_mask"])[:, :, None]

    teachers = last_states(bundle)
    drawn, logits_only = (float(((last_states(one.bundle) - teachers) ** 2).mean())
                          for one in (student, distill.distill(bundle, data, replace(FAST, hidden_weight=0.0))))
    assert drawn < logits_only / 2, (drawn, logits_only)


def test_the_students_attention_relations_are_drawn_towards_the_teachers(
    teacher: tuple[bytes, datasets.LoadedDataset],
) -> None:
    bundle, data = teacher
    texts = [data.texts[i] for i in data.validation]

    def projections(bundle: bytes, layer: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        model, reader, _ = load_text_classifier(archive.unpack(bundle))
        taps = distill._Taps(distill._layer_list(model), [layer], projections=True)
        feeds = inference.encode(reader, texts, input_names(model))
        with torch.no_grad():
            model(**{name: torch.from_numpy(array) for name, array in feeds.items()})
        return taps.projections(), torch.from_numpy(feeds["attention_mask"])

    teachers, mask = projections(bundle, 1)  # the 1-layer student's layer stands for the teacher's last

    def distance(params: distill.DistillParams) -> float:
        students, _ = projections(distill.distill(bundle, data, params).bundle, 0)
        return float(distill._relations_loss(students, teachers, mask, heads=2))

    logits_only = replace(FAST, hidden_weight=0.0)
    drawn, not_drawn = distance(replace(logits_only, attention_weight=1.0)), distance(logits_only)
    assert drawn < not_drawn / 2, (drawn, not_drawn)


def test_the_relations_loss_is_zero_for_the_same_relations_and_blind_to_padding() -> None:
    torch.manual_seed(0)
    teacher = [torch.randn(2, 5, 8) for _ in range(3)]  # queries, keys, values of 2 texts, 5 tokens, 2 heads of 4
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    padded_otherwise = [t.clone() for t in teacher]
    for t in padded_otherwise:
        t[1, 3:] = torch.randn(2, 8) * 10
    assert float(distill._relations_loss(teacher, teacher, mask, heads=2)) == pytest.approx(0.0, abs=1e-6)
    assert float(distill._relations_loss(padded_otherwise, teacher, mask, heads=2)) == pytest.approx(0.0, abs=1e-6)
    other = [t + torch.randn_like(t) for t in teacher]
    assert float(distill._relations_loss(other, teacher, mask, heads=2)) > 0.01


def test_a_distilbert_layers_projections_are_found_and_a_layer_without_them_is_refused() -> None:
    from transformers import DistilBertConfig, DistilBertModel

    model = DistilBertModel(DistilBertConfig(vocab_size=100, dim=16, n_layers=2, n_heads=2, hidden_dim=32))
    layer = distill._layer_list(model)[0]
    assert distill._projections(layer) == [layer.attention.q_lin, layer.attention.k_lin, layer.attention.v_lin]
    with pytest.raises(OptimizeError, match="its encoder layers have no self-attention projections") as raised:
        distill._projections(torch.nn.Linear(2, 2))
    assert "BERT-like" in raised.value.hint


@pytest.mark.parametrize(("teacher_layers", "student_layers", "kept", "matched"), [
    (6, 3, [0, 2, 4], [1, 3, 5]), (6, 2, [0, 3], [2, 5]), (2, 1, [0], [1]), (12, 4, [0, 3, 6, 9], [2, 5, 8, 11]),
    (6, 5, [0, 1, 2, 4, 5], [0, 1, 3, 4, 5]),
])
def test_the_student_keeps_layers_spread_over_the_teachers_depth(
    teacher_layers: int, student_layers: int, kept: list[int], matched: list[int]
) -> None:
    assert distill.spread(teacher_layers, student_layers) == (kept, matched)


def test_a_variant_is_a_part_of_its_text_in_order() -> None:
    rng = random.Random(0)
    text = " ".join(f"w{n}" for n in range(40))
    variants = [distill.variant(text, rng) for _ in range(200)]
    for changed in variants:
        words = changed.split()
        assert 3 <= len(words) < 40 and set(words) <= set(text.split()), changed
        assert words == sorted(words, key=lambda word: int(word[1:])), changed  # dropped or cut, never shuffled
    assert len(set(variants)) > 150  # a different one each time
    assert any(len(v.split()) > 36 for v in variants)  # words dropped: a run keeps at most 90% (36)

    def a_run(words: list[str]) -> bool:
        start = int(words[0][1:])
        return words == text.split()[start : start + len(words)]

    assert sum(a_run(v.split()) for v in variants) > 50  # a run of words kept, about half of the time
    assert distill.variant("too short here", rng) == "too short here"
    assert distill.variant("日本語のテキストです", rng) == "日本語のテキストです"


def test_the_same_seed_gives_the_same_student(teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    short = replace(FAST, epochs=1)
    first, again = distill.distill(*teacher, short), distill.distill(*teacher, short)
    other = distill.distill(*teacher, replace(short, seed=1))
    assert first.bundle == again.bundle
    assert other.bundle != first.bundle


def test_progress_is_reported_and_should_stop_stops(teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    seen: list[tuple[int, int]] = []
    with pytest.raises(JobInterrupted, match="stopped before it finished"):
        distill.distill(*teacher, FAST, progress=lambda step, total: seen.append((step, total)),
                        should_stop=lambda: len(seen) >= 3)
    steps_per_epoch = -(-len(teacher[1].train) * (1 + FAST.variants) // FAST.batch_size)  # each text, and a variant
    assert FAST.variants == 1
    assert seen == [(step, steps_per_epoch * FAST.epochs) for step in (1, 2, 3)]


def test_a_small_dataset_is_given_the_epochs_that_min_steps_asks(teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    steps_per_epoch = -(-len(teacher[1].train) * (1 + FAST.variants) // FAST.batch_size)
    seen: list[tuple[int, int]] = []
    student = distill.distill(*teacher, replace(FAST, epochs=1, min_steps=2 * steps_per_epoch + 1),
                              progress=lambda step, total: seen.append((step, total)))
    assert student.epochs == 3
    assert seen == [(step, 3 * steps_per_epoch) for step in range(1, 3 * steps_per_epoch + 1)]


def test_a_large_dataset_trains_each_epoch_on_a_sample_of_its_batches_within_max_steps(
        teacher: tuple[bytes, datasets.LoadedDataset]) -> None:
    """max_steps bounds the teaching whatever the data's size: each epoch draws max_steps // epochs of the data's
    batches (another draw each epoch), and the report says so."""
    steps_per_epoch = -(-len(teacher[1].train) * (1 + FAST.variants) // FAST.batch_size)
    assert steps_per_epoch > 2
    seen: list[tuple[int, int]] = []
    student = distill.distill(*teacher, replace(FAST, max_steps=2 * FAST.epochs),
                              progress=lambda step, total: seen.append((step, total)))
    assert seen == [(step, 2 * FAST.epochs) for step in range(1, 2 * FAST.epochs + 1)]
    assert student.epochs == FAST.epochs and student.epoch_batches == 2 and student.data_batches == steps_per_epoch
    assert f"{FAST.epochs} epochs (each 2 batches drawn from the data's {steps_per_epoch})" in student.describe()
    assert student.metrics["accuracy"] > CHANCE
    large = replace(student, evaluated_on=2000, validation_examples=60000).describe()
    assert large.endswith("(on a stratified sample of 2,000 of 60,000 validation examples)")
    with pytest.raises(OptimizeError, match="max_steps, 2, is below its epochs") as refused:
        distill.distill(*teacher, replace(FAST, max_steps=2))
    assert "raise max_steps" in refused.value.hint


def test_without_a_rate_the_first_epoch_chooses_one_and_only_its_student_goes_on(
    teacher: tuple[bytes, datasets.LoadedDataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distill, "LEARNING_RATES", (0.0, FAST.learning_rate))  # one that cannot learn, one that can
    steps_per_epoch = -(-len(teacher[1].train) * (1 + FAST.variants) // FAST.batch_size)
    seen: list[tuple[int, int]] = []
    student = distill.distill(*teacher, replace(FAST, learning_rate=None),
                              progress=lambda step, total: seen.append((step, total)))
    assert list(student.searched) == [0.0, FAST.learning_rate]
    assert student.searched[0.0]["macro_f1"] < student.searched[FAST.learning_rate]["macro_f1"]
    assert student.learning_rate == FAST.learning_rate
    assert student.metrics["accuracy"] >= student.teacher_metrics["accuracy"] - 0.1, student
    # Both rates learn through the first epoch; then one student alone, for the epochs asked.
    total = steps_per_epoch * (FAST.epochs + 1)
    assert seen == [(step, total) for step in range(1, total + 1)]
    assert student.epochs == FAST.epochs
    assert f"lr {FAST.learning_rate:g}, the best by validation macro-F1 after the first epoch (0 " in student.describe()


@pytest.mark.parametrize("rate", [FAST.learning_rate, None])
def test_a_time_limit_cuts_the_epochs_to_what_fits_and_the_report_says_so(
    teacher: tuple[bytes, datasets.LoadedDataset], monkeypatch: pytest.MonkeyPatch, rate: float | None
) -> None:
    """No time left after the first epoch (the search's, where the rate is searched): it ends there, having reported
    the steps it taught; with time enough, every epoch runs."""
    monkeypatch.setattr(distill, "LEARNING_RATES", (FAST.learning_rate, FAST.learning_rate / 2))
    seen: list[tuple[int, int]] = []
    cut = distill.distill(*teacher, replace(FAST, learning_rate=rate), within_s=0.0,
                          progress=lambda step, total: seen.append((step, total)))
    assert cut.epochs == 1 and cut.planned_epochs == FAST.epochs
    steps_per_epoch = -(-len(teacher[1].train) * (1 + FAST.variants) // FAST.batch_size)
    taught = steps_per_epoch * (1 if rate else 2)  # one student's steps, or both rates' in the search
    assert [step for step, _ in seen] == list(range(1, taught + 1))
    assert f"1 epoch (of {FAST.epochs}: as many as its time limit held)" in cut.describe()
    assert cut.metrics["accuracy"] > CHANCE
    held = distill.distill(*teacher, replace(FAST, learning_rate=rate), within_s=3600.0)
    assert held.epochs == held.planned_epochs == FAST.epochs and "time limit" not in held.describe()


def test_where_a_time_limit_cuts_the_epochs_the_learning_rate_falls_to_0_at_the_new_end(
    teacher: tuple[bytes, datasets.LoadedDataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distill, "_epoch_pace_s", lambda last_epoch_s, students: 600.0)  # time for one epoch more
    rates: list[float] = []
    learn = distill._Pupil.learn

    def learning(pupil: distill._Pupil, *args: object) -> None:
        learn(pupil, *args)
        rates.append(pupil.optimizer.param_groups[0]["lr"])

    monkeypatch.setattr(distill._Pupil, "learn", learning)
    cut = distill.distill(*teacher, replace(FAST, epochs=4), within_s=1000.0)
    assert (cut.epochs, cut.planned_epochs) == (2, 4)
    steps_per_epoch = len(rates) // 2
    first, second = rates[:steps_per_epoch], rates[steps_per_epoch:]
    assert first[-1] == pytest.approx(FAST.learning_rate * 3 / 4)  # on the way to 0 at the end of 4 epochs
    assert second == sorted(second, reverse=True) and second[-1] == 0.0  # refitted: 0 at the end of the second


def test_a_given_rate_is_not_searched(student: distill.Student) -> None:
    assert student.learning_rate == FAST.learning_rate and student.searched == {}
    assert f"lr {FAST.learning_rate:g} as given, taught the teacher's soft labels, layers' states:" in student.describe()
    assert "soft labels, layers' states, attention relations:" in replace(
        student, params=replace(FAST, attention_weight=1.0)).describe()


@pytest.mark.parametrize("layers", [0, 2, 5])
def test_a_layer_count_out_of_range_is_refused(teacher: tuple[bytes, datasets.LoadedDataset], layers: int) -> None:
    with pytest.raises(OptimizeError, match=f"from 1 to 1 of the teacher's 2 encoder layers, not {layers}") as raised:
        distill.distill(*teacher, distill.DistillParams(layers=layers))
    assert "choose a layer count from 1 to 1" in raised.value.hint


def test_a_bundle_or_dataset_that_cannot_be_distilled_is_refused(
    teacher: tuple[bytes, datasets.LoadedDataset],
) -> None:
    bundle, data = teacher
    image = archive.pack([("appliance.json", b'{"task": "image-classification", "labels": ["a", "b"]}'),
                          ("model.safetensors", b"")])
    with pytest.raises(OptimizeError, match="cannot distil this model: only text-classification") as raised:
        distill.distill(image, data, FAST)
    assert "text-classification bundle" in raised.value.hint
    no_train = datasets.LoadedDataset(None, data.labels, data.label_names, [], data.validation, data.texts)  # type: ignore[arg-type]
    with pytest.raises(OptimizeError, match="needs training and validation examples; this dataset has 0 and"):
        distill.distill(bundle, no_train, FAST)
    renamed = datasets.LoadedDataset(None, ["other", *data.labels[1:]], data.label_names, data.train,  # type: ignore[arg-type]
                                     data.validation, data.texts)
    with pytest.raises(OptimizeError, match="labels the teacher was not trained on: other"):
        distill.distill(bundle, renamed, FAST)
    with pytest.raises(OptimizeError, match="at least one epoch and one example a batch, not 0 epochs of 16"):
        distill.distill(bundle, data, replace(FAST, epochs=0))
    with pytest.raises(OptimizeError, match="weights cannot be negative, not hidden_weight 10 and attention_weight -1"):
        distill.distill(bundle, data, replace(FAST, attention_weight=-1.0))
    with pytest.raises(OptimizeError, match="can keep from 1 to 63 of the teacher's 64 units, not 64") as raised:
        distill.distill(bundle, data, replace(FAST, width=64))
    assert "choose a width from 1 to 63" in raised.value.hint


def test_a_model_without_an_encoder_layer_list_is_refused() -> None:
    model = torch.nn.Module()
    model.base_model, model.config = torch.nn.Linear(2, 2), type("Config", (), {"model_type": "mlp"})()
    with pytest.raises(OptimizeError, match="cannot distil a mlp model: it has no encoder layer list") as raised:
        distill._encoder_layers(model, 1)
    assert "BERT-like" in raised.value.hint
