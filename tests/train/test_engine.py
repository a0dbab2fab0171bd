"""The training engine on real data, a real (tiny) model and the real store."""

from __future__ import annotations

import csv
import importlib
import io
import itertools
import json
import math
import random
import tarfile
from pathlib import Path

import pytest
import torch

from appliance import store
from appliance.data import datasets
from appliance.store import Store, audit, blobs
from appliance.train import bundle, checkpoint, engine, runs, tasks
from appliance.train.params import TrainParams
from tests.conftest import FILLER, WORDS, run_cli, write_tickets

FAST = {"mode": "full", "epochs": 8, "learning_rate": 3e-3, "batch_size": 16, "checkpoint_every": 5, "seed": 3}


def _bundle_files(opened: Store, blob_id: str) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blobs.read(opened, blob_id))) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}


def test_a_run_learns_and_leaves_a_self_contained_model(opened: Store, tickets: str, tiny_base: Path) -> None:
    reports: list[engine.Progress] = []
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST),
                          progress=reports.append)

    assert result.status == "finished"
    assert result.metrics["accuracy"] > 0.9, result.metrics
    assert reports and reports[-1].step == result.steps and reports[0].samples_per_s > 0

    files = _bundle_files(opened, result.model_blob)
    assert {"config.json", "model.safetensors", "tokenizer.json", "appliance.json"} <= set(files)
    manifest = json.loads(files["appliance.json"])
    assert manifest["labels"] == ["billing", "shipping", "technical"]

    run = runs.get(opened, result.run_id)
    planned = "cuda:0" if torch.cuda.is_available() else "cpu"  # the best the box has, as no device was named
    assert run.status == "finished" and run.plan["device"] == planned and run.params["seed"] == 3
    history = runs.epochs(opened, result.run_id)
    assert [row.epoch for row in history] == list(range(1, len(history) + 1))
    assert all(later.elapsed_s > earlier.elapsed_s for earlier, later in itertools.pairwise(history))
    assert {"train.start", "train.epoch", "checkpoint.save", "train.finished"} <= {
        row["action"] for row in audit.rows(opened)
    }
    # A finished run keeps its model, not its checkpoint.
    assert opened.db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 0


def test_a_sentence_encoder_trains_without_attention_dropout_in_the_kernel_fastest_where_it_runs(
    opened: Store, tickets: str, tiny_sentence_base: Path,
) -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert [tasks.attention_kernel(cpu, 128), tasks.attention_kernel(cpu, 129), tasks.attention_kernel(gpu, 128)] == [
        "eager", "sdpa", "sdpa"]

    result = engine.start(opened, dataset=tickets, base_dir=tiny_sentence_base,
                          params=TrainParams(**{**FAST, "epochs": 2}))
    config = json.loads(_bundle_files(opened, result.model_blob)["config.json"])
    assert config["attention_probs_dropout_prob"] == 0.0
    assert config["hidden_dropout_prob"] == 0.1  # the base model's, kept

    # Eager attention reads the padding mask as the fused kernel does: the kernel changes the speed, not the model.
    model, reader, _ = bundle.load_text_classifier(_bundle_files(opened, result.model_blob))
    feeds = reader.see(["a short one", "a much longer ticket " * 6]).feeds
    ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
    with torch.no_grad():
        tasks.use_attention(model, "eager")
        eager = model(input_ids=ids, attention_mask=mask).logits
        tasks.use_attention(model, "sdpa")
        fused = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(eager, fused, rtol=1e-4, atol=1e-5)


def test_early_stopping_ends_a_run_that_stopped_improving(opened: Store, tickets: str, tiny_base: Path) -> None:
    params = TrainParams(**{**FAST, "epochs": 30, "patience": 1})
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)
    assert result.stopped_early
    assert len(runs.epochs(opened, result.run_id)) < 30


def test_a_stop_request_checkpoints_and_resume_ends_like_an_uninterrupted_run(
    opened: Store, tickets: str, tiny_base: Path
) -> None:
    params = TrainParams(**FAST)
    straight = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)

    steps = iter(range(1000))
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params,
                           should_stop=lambda: next(steps) == 7)
    assert stopped.status == "interrupted" and stopped.steps == 8
    assert runs.get(opened, stopped.run_id).status == "interrupted"

    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.steps == straight.steps
    for name, value in straight.metrics.items():
        assert resumed.metrics[name] == pytest.approx(value, abs=1e-5), name


def test_a_checkpoint_written_with_the_unfused_adamw_resumes_with_the_fused_one(
        opened: Store, tickets: str, tiny_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run checkpointed by a version that updated with torch's default AdamW (its saved parameter groups say
    fused: None) goes on with the fused kernel, which on a CPU takes a fifth of the time, and learns the same."""
    adam = importlib.import_module("torch.optim.adam")  # the module: torch.optim.adam names its function
    params = TrainParams(**FAST)
    straight = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)
    steps = iter(range(1000))
    with monkeypatch.context() as earlier_version:
        earlier_version.setattr(tasks, "adamw", lambda groups, rate: torch.optim.AdamW(groups, lr=rate))
        stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params,
                               should_stop=lambda: next(steps) == 7)
    assert stopped.status == "interrupted"

    fused_updates = []
    fused = adam._fused_adam
    monkeypatch.setattr(adam, "_fused_adam", lambda *a, **k: fused_updates.append(1) or fused(*a, **k))
    resumed = engine.resume(opened, stopped.run_id)
    assert len(fused_updates) == 2 * (resumed.steps - stopped.steps)  # a call per group: decayed, not decayed
    for name, value in straight.metrics.items():
        assert resumed.metrics[name] == pytest.approx(value, abs=1e-4), name


def test_a_run_stores_its_model_once_and_checkpoints_on_its_cadence_without_changing_what_it_learns(
        opened: Store, tickets: str, tiny_base: Path) -> None:
    def stored_blobs() -> int:
        return opened.db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0]

    before = stored_blobs()
    usual = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**{
        **FAST, "checkpoint_every": None}))  # the default cadence, ten minutes: this run takes seconds
    assert not audit.rows(opened, action="checkpoint.save")
    assert stored_blobs() == before + 1 and usual.model_blob  # the best model, stored as the run ended

    often = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**{
        **FAST, "checkpoint_every": None, "checkpoint_minutes": 1e-6}))  # due after every step
    steps = [json.loads(row["details"])["step"] for row in audit.rows(opened, action="checkpoint.save")]
    assert steps == list(range(1, often.steps + 1))
    assert often.metrics == usual.metrics and often.steps == usual.steps


def test_the_best_weights_so_far_travel_in_the_checkpoint(opened: Store, tickets: str, tiny_base: Path) -> None:
    steps = iter(range(1000))
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST),
                           should_stop=lambda: next(steps) == 16)  # in the second epoch
    state = checkpoint.state(checkpoint.latest(opened, stopped.run_id))
    assert state["position"]["best_epoch"] == 1 and state["position"]["best_blob"] is None  # not stored yet
    assert set(state["best"]) == set(state["model"])
    assert not torch.equal(state["best"]["classifier.weight"], state["model"]["classifier.weight"])
    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.model_blob


def test_lora_trains_adapters_only(opened: Store, tickets: str, tiny_base: Path) -> None:
    params = TrainParams(**{**FAST, "lora": True, "learning_rate": 1e-2})
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params)
    assert result.status == "finished"
    files = _bundle_files(opened, result.model_blob)
    assert not any("lora" in key for key in json.loads(files["config.json"]))  # merged into plain weights


def test_a_finished_run_cannot_be_resumed(opened: Store, tickets: str, tiny_base: Path) -> None:
    from appliance.core.errors import JobError

    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**{**FAST, "epochs": 1}))
    with pytest.raises(JobError, match="already finished"):
        engine.resume(opened, result.run_id)


def test_an_interrupted_run_is_discarded_its_checkpoint_deleted_and_never_resumed(
    opened: Store, tickets: str, tiny_base: Path
) -> None:
    """Each interrupted run kept its checkpoint (a real model's: hundreds of MB) for a resume that may never come."""
    from appliance.core.errors import JobError

    steps = iter(range(1000))
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**FAST),
                           should_stop=lambda: next(steps) == 6)
    kept = opened.db.execute("SELECT blob_id FROM checkpoints WHERE run_id = ?", (stopped.run_id,)).fetchone()[0]
    finished = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**{**FAST, "epochs": 1}))
    opened.close()
    assert "give --yes" in run_cli("runs", "discard", stopped.run_id).stderr  # no terminal to ask at
    discarded = run_cli("runs", "discard", stopped.run_id[:8], "--yes", check=True)
    assert f"run {stopped.run_id} discarded: its checkpoint (" in discarded.stdout
    refused = run_cli("runs", "discard", finished.run_id, "--yes")
    assert refused.returncode == 1 and f"run {finished.run_id} has finished: it keeps no checkpoint" in refused.stderr
    assert "discarded" in run_cli("runs", "list", check=True).stdout

    with store.open(opened.settings) as again:
        assert runs.get(again, stopped.run_id).status == "discarded"
        assert again.db.execute("SELECT COUNT(*) FROM blobs WHERE id = ?", (kept,)).fetchone()[0] == 0
        [gone] = [row for row in audit.rows(again, action="checkpoint.discard") if row["object"] == stopped.run_id]
        [record] = audit.rows(again, action="train.discarded")
        assert json.loads(gone["details"])["blob"] == kept and json.loads(record["details"])["freed_bytes"] > 0
        with pytest.raises(JobError, match="has already been discarded"):
            engine.resume(again, stopped.run_id)


def test_a_base_model_saved_in_half_precision_trains_with_fp32_weights(
    opened: Store, tickets: str, tiny_base: Path, tmp_path: Path
) -> None:
    """Many published checkpoints are FP16; AdamW on FP16 weights loses its updates to rounding."""
    import shutil

    from transformers import AutoModel

    half = tmp_path / "half"
    shutil.copytree(tiny_base, half)
    AutoModel.from_pretrained(tiny_base, dtype=torch.float16).save_pretrained(half)
    result = engine.start(opened, dataset=tickets, base_dir=half, params=TrainParams(**FAST))
    assert result.metrics["accuracy"] > 0.9
    weights = _bundle_files(opened, result.model_blob)["model.safetensors"]
    from safetensors.torch import load

    assert {tensor.dtype for tensor in load(weights).values()} == {torch.float32}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_path_fine_tunes_the_bundled_model_with_mixed_precision(opened: Store) -> None:
    """The quickstart's own job on a GPU: the default base model, the sample data, default parameters."""
    from importlib import resources

    from appliance.data import datasets

    with resources.as_file(resources.files("appliance.samples") / "support_tickets.csv") as sample:
        datasets.import_file(opened, sample, name="sample")
    result = engine.start(opened, dataset="sample", base_dir=opened.settings.base_model, params=TrainParams(),
                          device="cuda")
    run = runs.get(opened, result.run_id)
    assert run.plan["device"].startswith("cuda")
    assert run.plan["precision"] in ("bf16", "fp16")
    assert result.metrics["accuracy"] > 0.85


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_run_checkpoints_beside_training_and_resumes_where_it_stopped(
        opened: Store, tickets: str, tiny_base: Path) -> None:
    """The state copied from the GPU at each step's checkpoint, stored by the writer thread, loaded back onto it."""
    params = TrainParams(**{**FAST, "checkpoint_every": None, "checkpoint_minutes": 1e-6})  # one after every step
    straight = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params, device="cuda")
    steps = iter(range(1000))
    stopped = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=params, device="cuda",
                           should_stop=lambda: next(steps) == 7)
    assert stopped.status == "interrupted"
    state = checkpoint.state(checkpoint.latest(opened, stopped.run_id))
    assert state["position"]["step"] == stopped.steps == 8
    assert all(tensor.device.type == "cpu" for tensor in state["model"].values())
    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.steps == straight.steps
    assert straight.metrics["accuracy"] > 0.9 and resumed.metrics["accuracy"] > 0.9


@pytest.fixture
def many_tickets(opened: Store, tmp_path: Path) -> str:
    """A dataset whose validation split (2,400 examples) is larger than the engine evaluates after each epoch."""
    datasets.import_file(opened, write_tickets(tmp_path / "many.csv", per_class=4000), name="many")
    return "many"


def test_a_large_validation_split_is_sampled_each_epoch_and_evaluated_whole_at_the_end(
        opened: Store, many_tickets: str, tiny_base: Path) -> None:
    lines: list[str] = []
    result = engine.start(opened, dataset=many_tickets, base_dir=tiny_base, log=lines.append,
                          params=TrainParams(**{**FAST, "epochs": 1, "batch_size": 64}))
    assert result.outcome == runs.Outcome(best_epoch=1, epochs_run=1, stopped="epochs", evaluated_on=2400,
                                          validation_examples=2400)
    [epoch] = runs.epochs(opened, result.run_id)
    assert epoch.evaluated_on == engine.EVAL_SAMPLE == 2000
    assert lines[0] == "every text fits the 128-token window"
    assert lines[1].startswith("measured ") and " examples/s: an epoch of 9,600 takes about " in lines[1]
    assert "the run to its last epoch with evaluations about " in lines[1] and "budget" not in lines[1]
    assert lines[2].startswith("epoch 1/1: validation macro-F1 ") and "on a sample of 2,000 of 2,400" in lines[2]
    assert lines[3].startswith("final, on all validation examples: macro-F1 ")
    assert lines[4] == "kept epoch 1 of 1; stopped: all epochs run; final figures on all 2,400 validation examples"
    assert runs.get(opened, result.run_id).outcome == result.outcome
    assert runs.get(opened, result.run_id).metrics == result.metrics  # the whole split's figures are the run's


def test_the_budget_leaves_room_for_the_last_evaluation_and_says_what_the_figures_are_on(
        opened: Store, many_tickets: str, tiny_base: Path) -> None:
    lines: list[str] = []
    # A budget smaller than one evaluation of the sample: training stops at its first step, and nothing is left
    # for the whole split.
    result = engine.start(opened, dataset=many_tickets, base_dir=tiny_base, log=lines.append,
                          params=TrainParams(**{**FAST, "epochs": 50, "max_minutes": 0.001, "max_length": 8}))
    assert result.status == "finished" and result.steps == 1 and not result.stopped_early
    assert result.outcome == runs.Outcome(best_epoch=1, epochs_run=1, stopped="budget", evaluated_on=2000,
                                          validation_examples=2400)
    assert any(line.startswith("the final figures stay on the 2,000-example sample: evaluating all 2,400 would take")
               for line in lines)
    assert lines[0] == ("12,000 of 12,000 texts (100%) are longer than the 8-token window: the model reads the first 1"
                        " and last 5 tokens of each (head+tail; --truncation head for the other way); the base model"
                        " takes up to 128 (--max-length), at a cost in time")
    assert lines[-1] == ("kept epoch 1 of 1; stopped: the 0s budget; final figures on a stratified sample"
                         " of 2,000 of 2,400 validation examples")


def test_the_evaluation_sample_keeps_each_label_s_share_and_is_the_same_every_time(
        opened: Store, tmp_path: Path) -> None:
    path = tmp_path / "skewed.csv"
    with path.open("w") as f:
        f.write("text,label\n")
        for n in range(15000):
            f.write(f"ticket number {n} about {'billing' if n % 10 else 'shipping'},{'billing' if n % 10 else 'shipping'}\n")
    data = datasets.load(opened, datasets.import_file(opened, path, name="skewed"))
    sample = data.validation_sample(engine.EVAL_SAMPLE, seed=3)
    assert sample == data.validation_sample(engine.EVAL_SAMPLE, seed=3) and set(sample) <= set(data.validation)
    shares = {label: sum(data.labels[i] == label for i in sample) / len(sample) for label in ("billing", "shipping")}
    whole = {label: sum(data.labels[i] == label for i in data.validation) / len(data.validation)
             for label in ("billing", "shipping")}
    assert abs(len(sample) - engine.EVAL_SAMPLE) <= 2
    assert all(abs(shares[label] - whole[label]) < 0.002 for label in whole)


def test_a_run_says_early_how_long_it_takes_and_where_its_budget_ends_it(
        opened: Store, many_tickets: str, tiny_base: Path) -> None:
    lines: list[str] = []
    # 12 s: its first steps are measured within it on a machine busy with other work too
    result = engine.start(opened, dataset=many_tickets, base_dir=tiny_base, log=lines.append,
                          params=TrainParams(**{**FAST, "epochs": 1000, "max_minutes": 0.2}))
    assert result.outcome is not None and result.outcome.stopped == "budget"
    [said] = [line for line in lines if line.startswith("measured ")]
    assert "the run to its last epoch with evaluations about " in said
    assert "; the 12s budget stops it after about " in said and "epochs, keeping the best model by then" in said
    reached = float(said.split("stops it after about ")[1].split()[0])
    assert 0 < reached < 1000
    assert "its learning rate scheduled to end there" in said


def test_the_speed_said_early_is_the_epoch_s_whatever_batches_came_first() -> None:
    """A run's first steps may draw mostly long texts: the examples/s said from them is what the whole epoch will
    do, so an early estimate holds (counted in examples, these first steps would say 2.9 times the epoch's time)."""
    lengths = [128] * 320 + [16] * 960  # tokens of each text: a few long, most short
    batches = [list(range(start, start + 32)) for start in range(0, len(lengths), 32)]

    def cost(batch: list[int]) -> int:  # padded tokens, as a text task counts them
        return len(batch) * max(lengths[i] for i in batch)

    seconds_per_token = 1e-4  # this machine: a step's time grows with its tokens
    epoch_s = sum(map(cost, batches)) * seconds_per_token
    speed = engine._Speed()
    speed.epoch(sum(map(cost, batches)) / len(lengths))
    for batch in batches[:6]:  # the long ones come first
        rate = speed.step(cost(batch), cost(batch) * seconds_per_token)
    assert len(lengths) / rate == pytest.approx(epoch_s)


def test_a_budgeted_run_fits_its_schedule_again_once_its_first_epoch_is_measured(
        opened: Store, many_tickets: str, tiny_base: Path) -> None:
    """The early estimate rests on seconds of training; after the first epoch and its evaluation the run says how
    long it takes again and sets the budget's horizon from those figures, the one a resumed run keeps."""
    lines: list[str] = []
    # A budget the first epoch (7 s here when idle) fits in on a machine busy with other work too, and whose tenth,
    # the early estimate's probe, is shorter than that epoch; it is stopped after that epoch.
    params = TrainParams(**{**FAST, "epochs": 1000, "max_minutes": 0.75, "checkpoint_every": None})
    stopped = engine.start(opened, dataset=many_tickets, base_dir=tiny_base, log=lines.append, params=params,
                           should_stop=lambda: any(line.startswith("after the first epoch") for line in lines))
    assert stopped.status == "interrupted"
    [said] = [line for line in lines if line.startswith("after the first epoch, measured ")]
    assert lines.index(said) == lines.index(next(line for line in lines if line.startswith("epoch 1/1000"))) + 1
    reached = float(said.split("stops it after about ")[1].split()[0])
    horizon = checkpoint.state(checkpoint.latest(opened, stopped.run_id))["position"]["schedule_steps"]
    steps_per_epoch = runs.epochs(opened, stopped.run_id)[0].step
    assert abs(horizon - reached * steps_per_epoch) <= 0.05 * steps_per_epoch + 1  # the estimate's one decimal


def test_freeze_is_refused_for_a_text_run(opened: Store, tickets: str, tiny_base: Path) -> None:
    from appliance.core.errors import JobError

    with pytest.raises(JobError, match="freeze is for image backbones"):
        engine.start(opened, dataset=tickets, base_dir=tiny_base, params=TrainParams(**{**FAST, "freeze": 0.5}))


def test_a_run_cut_by_its_budget_decays_its_learning_rate_to_the_budget_s_end_and_keeps_that_on_resume(
        opened: Store, many_tickets: str, tiny_base: Path) -> None:
    """The schedule is fitted to the steps the budget holds once training speed is measured; a resumed run keeps it,
    so its rate goes on falling where the first session left it."""
    lines: list[str] = []
    params = TrainParams(**{**FAST, "epochs": 50, "max_minutes": 0.2, "schedule": "linear", "warmup_ratio": 0.0})
    checks_since_estimate = iter(range(10**6))
    stopped = engine.start(  # a step after the estimate, the first whose rate follows the new schedule
        opened, dataset=many_tickets, base_dir=tiny_base, log=lines.append, params=params,
        should_stop=lambda: any(line.startswith("measured ") for line in lines) and next(checks_since_estimate) == 1)
    assert stopped.status == "interrupted"
    [said] = [line for line in lines if line.startswith("measured ")]
    reached = float(said.split("stops it after about ")[1].split()[0])
    saved = checkpoint.state(checkpoint.latest(opened, stopped.run_id))
    horizon = saved["position"]["schedule_steps"]
    steps_per_epoch = math.ceil(9600 / 16)
    assert abs(horizon - reached * steps_per_epoch) <= 0.05 * steps_per_epoch + 1  # the estimate's one decimal
    assert horizon < 50 * steps_per_epoch
    rate = saved["optimizer"]["param_groups"][0]["lr"]
    warmed = saved["position"]["step"] - 1  # warm-up is one step at least
    assert rate == pytest.approx(FAST["learning_rate"] * (1 - warmed / (horizon - 1)), rel=1e-6)

    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.outcome is not None and resumed.outcome.stopped == "budget"


def _letters(opened: Store, tmp_path: Path, per_label: int, filler: int, seed: int) -> None:
    """The dataset "letters": per label, texts of `filler` random filler words, then two of the label's words."""
    rng = random.Random(seed)
    path = tmp_path / "letters.csv"
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "label"])
        for label, words in WORDS.items():
            for _ in range(per_label):
                writer.writerow([" ".join(rng.choices(FILLER, k=filler) + rng.sample(words, 2)), label])
    datasets.import_file(opened, path, name="letters")


def test_a_budgeted_run_on_long_texts_gets_a_longer_window_where_the_budget_holds_it(
        opened: Store, tmp_path: Path, tiny_base: Path) -> None:
    """Texts of about 150 tokens against the default 128-token window, a base model that takes 256: a run on a
    budget reads them whole at 192 tokens where the budget holds it; not where it does not, nor where the caller
    named a window or set no budget; and the log says which and why, before the run starts."""
    from transformers import BertConfig, BertModel

    roomy = tmp_path / "roomy-base"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=256)).save_pretrained(roomy)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (roomy / name).write_bytes((tiny_base / name).read_bytes())
    _letters(opened, tmp_path, per_label=250, filler=150, seed=7)

    def settled(**given: object) -> tuple[int, list[str]]:
        lines: list[str] = []
        run_id = engine.create(opened, dataset="letters", base_dir=roomy, params=TrainParams.parse(given),
                               log=lines.append)
        return runs.get(opened, run_id).params["max_length"], lines

    window, said = settled(max_minutes=600)
    assert window == 192
    assert said[1].startswith("100% of the texts sampled are longer than the 128-token window and 90% fit in 192 tokens,"
                              " which the base model takes; measured "), said
    assert " examples/s at 192 tokens against " in said[1] and ": a 192-token window, 5 epochs about " in said[1]
    assert "--max-length 128 keeps the shorter one" in said[1]
    # 1,000 epochs of 600 texts at 192 tokens do not fit in a minute even at the speed per token of 128 (one epoch
    # does: no fast mode), so the speed at 192 is not measured.
    window, said = settled(max_minutes=1, epochs=1000)
    assert window == 128 and "but 1000 epochs at 192 tokens would take at least" in said[1]
    assert "the 128-token window, each long text read head+tail" in said[1]
    assert settled(max_minutes=600, max_length=128)[0] == 128  # named: kept
    window, said = settled()  # no budget: the default window, and no estimate of a longer one
    assert window == 128 and len(said) == 1 and "with no budget" in said[0]


def test_a_run_reads_the_end_of_a_long_text_and_learns_what_its_beginning_does_not_say(
        opened: Store, tmp_path: Path, tiny_base: Path) -> None:
    """What says the label comes last, after 20 words of filler: head+tail (the default) reads it, head-only cannot,
    and the model is served as it was trained."""
    _letters(opened, tmp_path, per_label=60, filler=20, seed=5)
    lines: list[str] = []
    params = TrainParams(**{**FAST, "max_length": 16, "epochs": 15, "patience": 15})
    read_whole = engine.start(opened, dataset="letters", base_dir=tiny_base, params=params, log=lines.append)
    head_only = engine.start(opened, dataset="letters", base_dir=tiny_base, params=params.changed(truncation="head"))
    assert read_whole.metrics["accuracy"] > 0.75, read_whole  # chance is a third
    assert head_only.metrics["accuracy"] < 0.55, head_only
    assert lines[0].startswith("180 of 180 texts (100%) are longer than the 16-token window: the model reads the"
                               " first 3 and last 11 tokens of each (head+tail;")
    files = _bundle_files(opened, read_whole.model_blob)
    assert json.loads(files["appliance.json"])["truncation"] == "head+tail"
    assert json.loads(_bundle_files(opened, head_only.model_blob)["appliance.json"])["truncation"] == "head"
