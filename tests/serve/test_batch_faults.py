"""The batcher in process, on a real compiled model: one bad text never fails the others, and a long text
costs no more than the part of it the model can see."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance import inference
from appliance.core.errors import BadRequest, ServeError
from appliance.serve import batching

WORDS = ["refund", "parcel", "login", "the", "my", "invoice", "courier", "crash", "again", "please"]


class Spy:
    """The served tokenizer, seen from outside: what it was given, and texts that make it (or the model) fail."""

    def __init__(self, real: tokenizers.Tokenizer) -> None:
        self.real, self.given = real, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def encode_batch(self, texts: list[str]) -> list[Any]:
        self.given.append(list(texts))
        if "poison" in texts:  # the tokenizer refuses this text
            raise ValueError("cannot tokenise")
        encodings = self.real.encode_batch(texts)
        return [None if text == "broken" else encoding for text, encoding in zip(texts, encodings)]  # no feeds


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
    expected = inference.predict(servable.compiled, servable.reader, [t for r in requests for t in r])
    assert type(answers[1]) is BadRequest  # the caller's fault: 400
    assert answers[1].message == "instance 1 cannot be tokenised"  # its index, never its text
    assert type(answers[3]) is ServeError  # the model's failure, not the caller's: 503
    assert "broken" not in answers[3].message and "NoneType" not in answers[3].message
    offsets = np.cumsum([0] + [len(r) for r in requests])
    for index in (0, 2, 4):
        np.testing.assert_allclose(answers[index].logits, expected[offsets[index]:offsets[index + 1]], atol=1e-4)
    assert any(len(given) > 2 for given in spy.given)  # they shared a batch before it was tried text by text


def test_a_long_text_is_cut_to_what_the_model_sees_before_tokenising(servable: inference.Servable) -> None:
    window = servable.reader.truncation["max_length"]
    rng = np.random.default_rng(3)
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=400_000)]
    huge = " ".join(words)  # about 2.5 MB: whole, it takes the tokenizer seconds
    short = " ".join(words[:window])
    spy = Spy(servable.reader)
    batcher = batching.Batcher(servable.compiled, spy, max_batch_size=32, max_delay_ms=0)
    huge_answer, short_answer = run(batcher, [[huge], [short]])
    np.testing.assert_allclose(huge_answer.logits, short_answer.logits, atol=1e-5)  # the model saw the same tokens
    assert huge_answer.truncated == short_answer.truncated == [True]  # both fill the window
    assert max(len(text) for given in spy.given for text in given) <= len(short)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["word", "x" * 130, "!", "  ", "\t", "\n", "中", "é", "\x01", "\u200b", "[MASK]",
                                 "a.b", "_", "İ", "\ufffd", " ", " ", "12", "\u3000", "\u00a0", "refund", "ß"]),
                max_size=300))
def test_the_cut_never_changes_the_encoding(servable: inference.Servable, pieces: list[str]) -> None:
    """Whitespace runs, words over WordPiece's length, marks, CJK, control characters: the tokens stay."""
    tokenizer = servable.reader
    text = "".join(pieces)
    cut = batching.cut_tail(text, batching.tail_cut(tokenizer))
    assert text.startswith(cut) and tokenizer.encode(cut).ids == tokenizer.encode(text).ids


def test_a_tokenizer_that_keeps_whitespace_in_its_tokens_is_not_cut() -> None:
    byte_level = tokenizers.Tokenizer(tokenizers.models.BPE())
    byte_level.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    byte_level.enable_truncation(8)
    assert batching.tail_cut(byte_level) is None
