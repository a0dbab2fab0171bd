"""How a text model reads a text: the window's tokens, a long text cut head-only or head+tail, the same in training
and serving, and the cut that bounds a long text's cost never changing what the model reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance import words

WINDOW = 32


@pytest.fixture(scope="module")
def files(tiny_base: Path) -> dict[str, bytes]:
    return {name: (tiny_base / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}


def reader(files: dict[str, bytes], truncation: str | None = None, window: int = WINDOW) -> words.Words:
    manifest = {"max_length": window} | ({"truncation": truncation} if truncation else {})
    return words.Words.of(files, manifest)


def numbered(count: int) -> str:
    """count words of one token each, told apart by their position: 'one two ...' in digits."""
    return " ".join(str(n) for n in range(count))


def test_head_and_tail_keep_the_beginning_and_the_end_of_a_long_text(files: dict[str, bytes]) -> None:
    head_tail, head = reader(files, "head+tail"), reader(files, "head")
    plain = tokenizers.Tokenizer.from_str(files["tokenizer.json"].decode())
    plain.no_truncation()
    plain.no_padding()
    whole = plain.encode(numbered(200)).ids  # [CLS] 0 1 ... 199 [SEP]
    assert len(whole) == 202
    (ids,), _, (cut,) = head_tail.encode([numbered(200)])
    assert (head_tail.head, head_tail.tail) == (7, 23)  # a quarter of the 30 tokens between [CLS] and [SEP]
    assert cut and len(ids) == WINDOW and ids == whole[:8] + whole[-24:]
    (ids,), _, (cut,) = head.encode([numbered(200)])
    assert cut and ids == whole[:31] + whole[-1:]
    assert head.describe() == "the first 30 tokens"
    assert head_tail.describe() == "the first 7 and last 23 tokens"


def test_a_text_that_fits_is_read_whole_either_way_and_padded_in_steps(files: dict[str, bytes]) -> None:
    for truncation in ("head", "head+tail"):
        read = reader(files, truncation).see([numbered(30), numbered(3)])
        assert read.truncated == [False, False]
        assert read.feeds["input_ids"].shape == (2, WINDOW)
        assert read.feeds["attention_mask"].sum(axis=1).tolist() == [32, 5]
    assert reader(files, "head").see([numbered(10)]).feeds["input_ids"].shape == (1, 16)  # 12 tokens, padded to 16


def test_a_model_from_before_the_choice_reads_head_only(files: dict[str, bytes]) -> None:
    assert reader(files).truncation == "head"
    with pytest.raises(ValueError, match="truncation 'middle' is none of head, head\\+tail"):
        reader(files, "middle")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["word", "x" * 130, "!", "  ", "\t", "\n", "中", "é", "\x01", "\u200b", "[MASK]",
                                 "a.b", "_", "İ", "\ufffd", " ", " ", "12", "\u3000", "\u00a0", "refund", "ß"]),
                max_size=300), st.sampled_from(["head", "head+tail"]))
def test_the_cut_never_changes_what_the_model_reads(files: dict[str, bytes], pieces: list[str], truncation: str
                                                     ) -> None:
    """Whitespace runs, words over WordPiece's length, marks, CJK, control characters: the window's tokens stay,
    and so does whether the text was cut."""
    read = reader(files, truncation)
    text = "".join(pieces)
    cut = read.cut(text)
    assert len(cut) <= len(text) + 1  # a space joins head and tail
    assert read.encode([cut]) == read.encode([text])


def test_a_long_text_is_cut_to_a_bounded_length_before_tokenising(files: dict[str, bytes]) -> None:
    read = reader(files, "head+tail")
    huge = numbered(100_000)
    assert len(read.cut(huge)) < 300 and read.encode([read.cut(huge)]) == read.encode([huge])


def test_a_tokenizer_that_keeps_whitespace_in_its_tokens_is_not_cut() -> None:
    byte_level = tokenizers.Tokenizer(tokenizers.models.BPE())
    byte_level.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    text = "word " * 1000
    assert words.Words(byte_level, 0, 8, "head+tail").cut(text) == text


def test_the_tokenizers_own_truncation_and_padding_are_not_the_models(files: dict[str, bytes]) -> None:
    """all-MiniLM's tokenizer.json pads every text to 128 and cuts there: the model's window is its manifest's."""
    fixed = json.loads(files["tokenizer.json"])
    fixed["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    fixed["padding"] = {"strategy": {"Fixed": 128}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                        "pad_type_id": 0, "pad_token": "[PAD]"}
    read = reader({**files, "tokenizer.json": json.dumps(fixed).encode()}, "head")
    assert read.see([numbered(20)]).feeds["input_ids"].shape == (1, 24)
