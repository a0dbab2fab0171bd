"""The batcher in process, on a real compiled model: same answers as one call, batched, bounded."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import openvino as ov
import pytest

from appliance import inference, words
from appliance.core.errors import Overloaded
from appliance.serve import batching
from tests.conftest import Trained


def test_concurrent_requests_share_inferences_and_get_their_own_answers(
    servable: inference.Servable, trained: Trained
) -> None:
    texts = trained.data.texts[:60] + ["parcel", "refund " * 60]
    expected = inference.softmax(inference.predict(servable.compiled, servable.reader, texts))
    batches: list[batching.Batch] = []

    async def scenario() -> list[batching.Inferred]:
        batcher = batching.Batcher(servable.compiled, servable.reader, max_batch_size=16, max_delay_ms=20,
                                   on_batch=batches.append)
        batcher.start()
        requests = [texts[i : i + 3] for i in range(0, len(texts), 3)]
        answers = await asyncio.gather(*(batcher.infer(request) for request in requests))
        await batcher.close()
        assert batcher.depth == 0
        return answers

    answers = asyncio.run(scenario())
    np.testing.assert_allclose(np.concatenate([answer.probabilities for answer in answers]), expected, atol=1e-4)
    assert sum(batch.size for batch in batches) == len(texts)
    assert max(batch.size for batch in batches) > 3  # requests were merged
    assert all(batch.size <= 16 for batch in batches)


def test_a_lone_request_on_an_idle_model_is_inferred_inline_and_a_crowd_still_shares_batches(
    servable: inference.Servable, trained: Trained
) -> None:
    texts = trained.data.texts[:40]
    expected = inference.softmax(inference.predict(servable.compiled, servable.reader, texts))
    batches: list[batching.Batch] = []

    async def scenario() -> tuple[list[batching.Inferred], list[batching.Inferred]]:
        batcher = batching.Batcher(servable.compiled, servable.reader, max_batch_size=16, max_delay_ms=5,
                                   on_batch=batches.append)
        batcher.start()
        one_by_one = [await batcher.infer([text], inline=True) for text in texts[:5]]
        crowd = await asyncio.gather(*(batcher.infer([text], inline=True) for text in texts))
        await batcher.close()
        return one_by_one, crowd

    one_by_one, crowd = asyncio.run(scenario())
    np.testing.assert_allclose(np.concatenate([answer.probabilities for answer in one_by_one]), expected[:5], atol=1e-4)
    np.testing.assert_allclose(np.concatenate([answer.probabilities for answer in crowd]), expected, atol=1e-4)
    assert [batch.size for batch in batches[:5]] == [1] * 5  # each recorded, on the loop
    assert max(batch.size for batch in batches[5:]) > batching.INLINE_TEXTS  # the crowd was batched


class _Counted:
    """An engine's infer requests, counting the pieces started on them."""

    def __init__(self, queue: ov.AsyncInferQueue) -> None:
        self.queue, self.started = queue, 0

    def start_async(self, *args: object, **kwargs: object) -> None:
        self.started += 1
        self.queue.start_async(*args, **kwargs)

    def wait_all(self) -> None:
        self.queue.wait_all()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenVINO runs one stream for throughput too")
def test_a_light_load_runs_on_the_latency_engine_and_a_crowd_on_the_throughput_one_with_the_same_answers(
    servable: inference.Servable, trained: Trained
) -> None:
    """Both engines are the same model: which one a batch took never changes its answer."""
    texts = trained.data.texts[:48]
    expected = inference.softmax(inference.predict(servable.compiled, servable.reader, texts))

    async def scenario() -> tuple[list[batching.Inferred], list[batching.Inferred], int, int, int]:
        batcher = batching.Batcher(servable.compiled, servable.reader, max_batch_size=4, max_delay_ms=5,
                                   compile_batched=servable.compile_batched)
        batcher.start()
        latency, throughput = _Counted(batcher._latency.queue), _Counted((await _throughput_engine(batcher)).queue)
        batcher._latency.queue, batcher._throughput.queue = latency, throughput  # type: ignore[assignment,union-attr]
        light = [await batcher.infer(texts[i : i + 6]) for i in range(0, 12, 6)]  # one request at a time
        started_light = throughput.started
        crowd = await asyncio.gather(*(batcher.infer([text]) for text in texts))  # 48 waiting: 6 batches per stream
        await batcher.close()
        return light, crowd, started_light, latency.started, throughput.started

    light, crowd, started_light, on_latency, on_throughput = asyncio.run(scenario())
    np.testing.assert_allclose(np.concatenate([answer.probabilities for answer in light]), expected[:12], atol=1e-4)
    np.testing.assert_allclose(np.concatenate([answer.probabilities for answer in crowd]), expected, atol=1e-4)
    assert started_light == 0 and on_latency >= 2
    assert on_throughput >= 48 // 4 - 2  # nearly every batch of the crowd: the last ones start as it thins out


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenVINO runs one stream for throughput too")
def test_a_quiet_batcher_lets_its_throughput_engine_go_and_compiles_it_again_when_a_crowd_comes_back(
    servable: inference.Servable, trained: Trained, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server at rest holds one compiled model, not two: the second is 20-50 MB of a MiniLM's weights."""
    monkeypatch.setattr(batching, "RELEASE_AFTER_S", 0.2)
    texts = trained.data.texts[:48]
    expected = inference.softmax(inference.predict(servable.compiled, servable.reader, texts))

    async def let_go(batcher: batching.Batcher) -> bool:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if batcher._throughput is None and not batcher._holding:
                return True
        return False

    async def scenario() -> tuple[bool, bool, list[list[batching.Inferred]], int]:
        batcher = batching.Batcher(servable.compiled, servable.reader, max_batch_size=4, max_delay_ms=5,
                                   compile_batched=servable.compile_batched)
        batcher.start()
        first = await _throughput_engine(batcher)  # compiled at start...
        unused_let_go = await let_go(batcher)  # ...and let go when no crowd came
        crowds = [await asyncio.gather(*(batcher.infer([text]) for text in texts))]  # asks for it again
        again = await _throughput_engine(batcher)
        counted = _Counted(again.queue)
        again.queue = counted  # type: ignore[assignment]
        crowds.append(await asyncio.gather(*(batcher.infer([text]) for text in texts)))
        used_let_go = await let_go(batcher)
        await batcher.close()
        return unused_let_go and again is not first, used_let_go, crowds, counted.started

    unused_let_go, used_let_go, crowds, on_the_new_engine = asyncio.run(scenario())
    assert unused_let_go and used_let_go
    for crowd in crowds:
        np.testing.assert_allclose(np.concatenate([answer.probabilities for answer in crowd]), expected, atol=1e-4)
    assert on_the_new_engine >= 48 // 4 - 2  # nearly every batch of the second crowd


async def _throughput_engine(batcher: batching.Batcher) -> batching._Engine:
    """The batcher's throughput engine, once compiled (off the event loop, so not at once)."""
    for _ in range(600):
        if batcher._throughput is not None:
            return batcher._throughput
        await asyncio.sleep(0.05)
    raise AssertionError("the throughput engine was not compiled within 30 s")


def test_a_batch_is_cut_only_where_long_texts_would_pad_short_ones() -> None:
    texts = ["a" * 40, "b" * 300, "c" * 900, "d" * 60, "e" * 800, "f" * 250]
    request = batching._Request(texts, future=None)  # type: ignore[arg-type]
    pieces = batching._pieces([(request, i) for i in range(len(texts))])
    # Short texts stay together whatever their ratio; a long one starts a piece when it is twice the shortest.
    assert [[request.examples[i][0] for _, i in piece] for piece in pieces] == [["a", "d", "f"], ["b"], ["e", "c"]]


def test_a_full_queue_refuses_at_once_and_answers_what_it_accepted(servable: inference.Servable) -> None:
    async def scenario() -> None:
        batcher = batching.Batcher(servable.compiled, servable.reader, max_batch_size=4, max_delay_ms=50,
                                   max_queue=5)
        batcher.start()
        accepted = asyncio.ensure_future(batcher.infer(["one", "two", "three", "four"]))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="would pass 5"):
            await batcher.infer(["five", "six"])
        assert (await accepted).probabilities.shape == (4, 3)
        await batcher.close()

    asyncio.run(scenario())


def test_texts_arriving_while_inference_is_busy_join_one_batch(servable: inference.Servable) -> None:
    """With no delay allowed, a text still waits for a free infer request, and the ones behind it ride along."""
    batches: list[batching.Batch] = []

    async def scenario() -> list[batching.Inferred]:
        batcher = batching.Batcher(servable.compiled, servable.reader, max_batch_size=16, max_delay_ms=0,
                                   on_batch=batches.append)
        batcher.start()
        requests = []
        for index in range(40):  # one text at a time, each after the event loop has had its turn
            requests.append(asyncio.ensure_future(batcher.infer([f"where is parcel {index}"])))
            await asyncio.sleep(0)
        answers = await asyncio.gather(*requests)
        await batcher.close()
        return answers

    answers = asyncio.run(scenario())
    assert all(answer.probabilities.shape == (1, 3) for answer in answers)
    assert sum(batch.size for batch in batches) == 40
    assert len(batches) <= 10  # one inference per text would be 40
    assert all(batch.size <= 16 for batch in batches)


def test_a_lone_request_does_not_wait_for_company(servable: inference.Servable) -> None:
    """The delay is for gathering texts while the model is busy; an idle model starts a lone text at once."""

    async def scenario() -> batching.Inferred:
        batcher = batching.Batcher(servable.compiled, servable.reader, max_batch_size=16, max_delay_ms=30_000)
        batcher.start()
        answer = await asyncio.wait_for(batcher.infer(["where is my parcel"]), timeout=15)
        await batcher.close()
        return answer

    assert asyncio.run(scenario()).probabilities.shape == (1, 3)


def test_a_quiet_model_hands_back_its_buffers_and_goes_on_answering(
    servable: inference.Servable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a quiet spell the batcher releases the model's buffers; when OpenVINO refuses (another user of the
    compiled model has an inference running), the batcher tries later instead of stopping to answer."""
    monkeypatch.setattr(batching, "RELEASE_AFTER_S", 0.1)

    class Busy:  # the compiled model as OpenVINO answers while another infer request of it runs
        refusals = 0

        def release_memory(self) -> None:
            if not self.refusals:
                self.refusals += 1
                raise RuntimeError("Attempt to call release_memory() on a compiled model in a busy state.")
            servable.compiled.release_memory()

    async def scenario() -> list[batching.Inferred]:
        batcher = batching.Batcher(servable.compiled, servable.reader)
        batcher.start()
        answers = [await batcher.infer(["where is my parcel"] * 8)]
        await asyncio.sleep(0.5)  # quiet: released, for real
        batcher._latency.compiled = busy = Busy()  # type: ignore[assignment]
        answers.append(await asyncio.wait_for(batcher.infer(["refund my invoice"]), timeout=15))
        await asyncio.sleep(0.5)  # quiet again: refused once, then released
        answers.append(await asyncio.wait_for(batcher.infer(["and my parcel"]), timeout=15))
        await batcher.close()
        assert busy.refusals == 1
        return answers

    answers = asyncio.run(scenario())
    assert [answer.probabilities.shape for answer in answers] == [(8, 3), (1, 3), (1, 3)]


def test_a_model_that_answered_lone_requests_inline_hands_back_its_buffers_too(
    servable: inference.Servable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone request on an idle model starts its own inference without the collector; the collector still gives
    the buffers back once the model has been quiet, after each such spell."""
    monkeypatch.setattr(batching, "RELEASE_AFTER_S", 0.1)

    class Counting:  # the compiled model, counting how often its buffers were given back
        released = 0

        def release_memory(self) -> None:
            self.released += 1
            servable.compiled.release_memory()

    async def scenario() -> list[int]:
        batcher = batching.Batcher(servable.compiled, servable.reader)
        batcher._latency.compiled = counting = Counting()  # type: ignore[assignment]
        batcher.start()
        released = []
        for text in ("where is my parcel", "refund my invoice"):
            await batcher.infer([text], inline=True)
            await asyncio.sleep(0.5)  # quiet
            released.append(counting.released)
        await batcher.close()
        return released

    assert asyncio.run(scenario()) == [1, 2]


def test_batches_come_in_few_shapes_so_the_models_memory_stays_bounded(servable: inference.Servable) -> None:
    """OpenVINO keeps kernels and buffers for every input shape it has seen: lengths go in steps of 8, never past
    the model's max_length, and a padded batch answers as its texts do alone."""
    max_length = servable.manifest["max_length"]
    texts = [" ".join(["parcel"] * count) for count in range(1, 3 * max_length)]
    widths = {servable.reader.see([text]).feeds["input_ids"].shape[1] for text in texts}
    assert all(width % words.PAD_MULTIPLE == 0 or width == max_length for width in widths)
    assert len(widths) <= max_length // words.PAD_MULTIPLE + 1
    alone = np.concatenate([inference.predict(servable.compiled, servable.reader, [text]) for text in texts[:5]])
    together = inference.predict(servable.compiled, servable.reader, texts[:5])
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_an_answer_says_which_texts_the_model_saw_only_the_beginning_of(servable: inference.Servable) -> None:
    window = servable.manifest["max_length"]
    texts = ["where is my parcel", "word " * (window - 2), "word " * (window - 1), "refund " * 5000]

    async def scenario() -> batching.Inferred:
        batcher = batching.Batcher(servable.compiled, servable.reader)
        batcher.start()
        answer = await batcher.infer(texts)
        await batcher.close()
        return answer

    # A window holds the text's tokens and the two special ones: window - 2 words fit, one more does not.
    assert asyncio.run(scenario()).truncated == [False, False, True, True]
