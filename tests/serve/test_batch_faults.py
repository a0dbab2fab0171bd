"""The batcher in process, on a real compiled model: one bad text never fails the others, and a long text
costs no more than the part of it the model can see."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from appliance import inference, words
from appliance.core.errors import BadRequest, ServeError
from appliance.serve import batching

WORDS = ["refund", "parcel", "login", "the", "my", "invoice", "courier", "crash", "again", "please"]


class Spy:
    """The served reader, seen from outside: what it was given, and texts that make it (or the model) fail."""

    def __init__(self, real: words.Words) -> None:
        self.real, self.given = real, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def see(self, texts: list[str]) -> words.Read:
        self.given.append(list(texts))
        if "poison" in texts:  # the tokenizer refuses this text
            raise ValueError("cannot tokenise")
        read = self.real.see(texts)
        return words.Read({}, read.truncated) if "broken" in texts else read  # no feeds: the model fails


def run(batcher: batching.Batcher, requests: list[list[str]]) -> list[batching.Inferred | Exception]:
    async def scenario() -> list[batching.Inferred | Exception]:
        batcher.start()
        answers = await asyncio.gather(*(batcher.infer(texts) for texts in requests), return_exceptions=True)
        await batcher.close()
        assert batcher.depth == 0
        return answers

    return asyncio.run(scenario())


def test_a_text_that_will_not_tokenise_fails_its_request_alone(servable: inference.Servable) -> None:
    spy = Spy(servable.reader)
    batcher = batching.Batcher(servable.compiled, spy, max_batch_size=32, max_delay_ms=50)
    requests = [[f"{word} help" for word in WORDS[:3]], ["refund please", "poison"], ["where is my parcel"],
                ["my login crashed", "broken"], [f"{word} again" for word in WORDS[3:]]]
    answers = run(batcher, requests)
    expected = inference.softmax(inference.predict(servable.compiled, servable.reader,
                                                    [t for r in requests for t in r]))
    assert type(answers[1]) is BadRequest  # the caller's fault: 400
    assert answers[1].message == "instance 1 cannot be tokenised"  # its index, never its text
    assert type(answers[3]) is ServeError  # the model's failure, not the caller's: 503
    assert "broken" not in answers[3].message and "NoneType" not in answers[3].message
    offsets = np.cumsum([0] + [len(r) for r in requests])
    for index in (0, 2, 4):
        np.testing.assert_allclose(answers[index].probabilities, expected[offsets[index]:offsets[index + 1]], atol=1e-4)
    assert any(len(given) > 2 for given in spy.given)  # they shared a batch before it was tried text by text


def test_a_long_text_is_cut_to_what_the_model_sees_before_tokenising(servable: inference.Servable) -> None:
    reader = servable.reader
    assert reader.truncation == "head+tail" and reader.head and reader.tail  # as training read it
    single = [word for word in WORDS if len(reader.encode([word])[0][0]) == 3]  # [CLS] word [SEP]: one token
    assert len(single) >= 5
    rng = np.random.default_rng(3)
    drawn = [single[i] for i in rng.integers(0, len(single), size=400_000)]
    huge = " ".join(drawn)  # about 2.5 MB: whole, it takes the tokenizer seconds
    seen = " ".join(drawn[: reader.head] + drawn[-reader.tail :])  # what the window keeps of it
    spy = Spy(reader)
    batcher = batching.Batcher(servable.compiled, spy, max_batch_size=32, max_delay_ms=0)
    huge_answer, seen_answer = run(batcher, [[huge], [seen]])
    np.testing.assert_allclose(huge_answer.probabilities, seen_answer.probabilities, atol=1e-5)  # the model saw the same tokens
    assert huge_answer.truncated == [True] and seen_answer.truncated == [False]  # the second fits exactly
    assert max(len(text) for given in spy.given for text in given) <= 3 * len(seen)
