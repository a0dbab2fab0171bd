"""Texts in, token ids out: how a text model reads a text, the same in training, optimisation and serving.

`tokenizers` and numpy only, so the inference kernel reads texts without torch or transformers.
A model reads at most `max_length` tokens, its special tokens ([CLS], [SEP]) included. A longer
text is cut one of two ways, the run's `truncation`, which the model's manifest keeps:

    head        its first tokens: what a tokenizer's own truncation does;
    head+tail   its first quarter-window and its last three quarters, the beginning and the
                conclusion of a long document (Sun et al., "How to Fine-Tune BERT for Text
                Classification", 2019: head+tail beat head-only and tail-only on long reviews
                and news). A manifest from before the choice existed reads as head.

A text's CPU is bounded by what the model can see: before tokenising, the part that the window
drops anyway is cut from the text (`cut`), so a 20,000-character text costs about what one the
length of the window does. Each read says which texts the window cut short (`Read.truncated`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import numpy as np
import tokenizers
from tokenizers import models, normalizers, pre_tokenizers

from appliance.data.datasets import Truncation

PAD_MULTIPLE = 8  # batches are padded to a length in these steps (see Words.see)
_WORDY = re.compile(r"\w[^ ]*+")  # from a word character to the end of its chunk between spaces; never backtracks


@dataclass(frozen=True)
class Read:
    """A batch of texts as the model reads them: its inputs padded alike, and per text whether the window cut it."""

    feeds: dict[str, np.ndarray]  # input_ids, attention_mask, token_type_ids: int64, texts x tokens
    truncated: list[bool]


class Words:
    """A text model's reader: its tokenizer, its window and how a longer text is cut to fit."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, pad_id: int, max_length: int, truncation: Truncation) -> None:
        if truncation not in get_args(Truncation):
            raise ValueError(f"truncation {truncation!r} is none of {', '.join(get_args(Truncation))}")
        tokenizer = tokenizers.Tokenizer.from_str(tokenizer.to_str())  # a copy: its own settings are cleared
        tokenizer.no_truncation()  # tokenizer.json may carry its own (all-MiniLM: pad to a fixed 128)
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.pad_id = pad_id
        self.max_length = max_length
        self.truncation = truncation
        special = tokenizer.encode("a").special_tokens_mask  # the template's special tokens around one word
        self._lead = next((n for n, flag in enumerate(special) if not flag), len(special))
        self._trail = next((n for n, flag in enumerate(reversed(special)) if not flag), 0)
        window = max_length - self._lead - self._trail
        if window < 2:
            raise ValueError(f"a window of {max_length} tokens leaves no room for text beside the special tokens")
        self.head = window if truncation == "head" else window // 4
        self.tail = window - self.head
        self._cuttable = _cuttable(tokenizer)

    @classmethod
    def of(cls, files: Mapping[str, bytes], manifest: Mapping[str, Any]) -> Words:
        """What a packed model reads with: its tokenizer files and manifest (max_length, truncation)."""
        tokenizer = tokenizers.Tokenizer.from_str(files["tokenizer.json"].decode())
        pad_token = json.loads(files.get("tokenizer_config.json", b"{}")).get("pad_token") or "[PAD]"
        pad_token = pad_token["content"] if isinstance(pad_token, dict) else pad_token
        return cls(tokenizer, tokenizer.token_to_id(pad_token) or 0, int(manifest["max_length"]),
                   manifest.get("truncation", "head"))

    def at(self, max_length: int) -> Words:
        """This reader with another window."""
        return Words(self._tokenizer, self.pad_id, max_length, self.truncation)

    @property
    def tokenizer_json(self) -> str:
        """The tokenizer as tokenizer.json holds it (with no truncation or padding of its own)."""
        return self._tokenizer.to_str()

    def describe(self) -> str:
        """How a text longer than the window is read, in words for a run's log and a model's card."""
        if self.truncation == "head":
            return f"the first {self.head} tokens"
        return f"the first {self.head} and last {self.tail} tokens"

    def encode(self, texts: Sequence[str]) -> tuple[list[list[int]], list[list[int]], list[bool]]:
        """Per text its token ids and type ids, special tokens included, cut to the window; and whether it was cut."""
        encodings = self._tokenizer.encode_batch([self.cut(text) for text in texts])
        ids, types, truncated = [], [], []
        for encoding in encodings:
            row, kinds = encoding.ids, encoding.type_ids
            cut = len(row) > self.max_length
            if cut:
                keep_to, keep_from = self._lead + self.head, len(row) - self._trail - self.tail
                row, kinds = row[:keep_to] + row[keep_from:], kinds[:keep_to] + kinds[keep_from:]
            ids.append(row)
            types.append(kinds)
            truncated.append(cut)
        return ids, types, truncated

    def see(self, texts: Sequence[str]) -> Read:
        """The model's inputs for a batch of texts, padded to the longest, rounded up to a multiple of PAD_MULTIPLE:
        OpenVINO keeps kernels and buffers for every input shape it has seen, about half a MB each and never given
        back, so lengths in steps of 8 bound a server's memory (336 shapes of mixed batches grew MiniLM's process by
        183 MB, 64 shapes by 59) at no measured cost in speed. Never past max_length, the length the model was
        given."""
        ids, types, truncated = self.encode(texts)
        width = max((len(row) for row in ids), default=0)
        if self.max_length % PAD_MULTIPLE == 0:
            width = -(-width // PAD_MULTIPLE) * PAD_MULTIPLE
        input_ids = np.full((len(ids), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        type_ids = np.zeros((len(ids), width), dtype=np.int64)
        for n, (row, kinds) in enumerate(zip(ids, types, strict=True)):
            input_ids[n, : len(row)] = row
            mask[n, : len(row)] = 1
            type_ids[n, : len(kinds)] = kinds
        return Read({"input_ids": input_ids, "attention_mask": mask, "token_type_ids": type_ids}, truncated)

    def cut(self, text: str) -> str:
        """text less what the window would drop anyway: its first head + 1 and last tail + 1 chunks (between spaces)
        with a word character in them, joined by a space; text itself where it is shorter, or where this tokenizer
        gives no such guarantee (see _cuttable).

        Each such chunk gives one token at least, and the tokens of a chunk do not depend on its neighbours, so
        the first head tokens of the cut text are the whole text's, and so are its last tail tokens; one chunk more
        on each side leaves the cut text longer than the window, so it still reads as truncated. One regex pass
        from each end."""
        keep_head, keep_tail = self.head + 1, self.tail + 1 if self.tail else 0
        if not self._cuttable or len(text) < 2 * (keep_head + keep_tail):  # each chunk needs a character and a space
            return text
        head_end = _chunk_end(text, keep_head)
        if head_end is None:
            return text
        if not keep_tail:
            return text[:head_end]
        from_end = _chunk_end(text[::-1], keep_tail)  # reversed, a chunk's end is where it starts
        if from_end is None or len(text) - from_end <= head_end:
            return text
        return text[:head_end] + " " + text[len(text) - from_end :]


def _chunk_end(text: str, chunks: int) -> int | None:
    """Where text's chunks-th chunk with a word character in it ends; None when it has fewer."""
    for count, found in enumerate(_WORDY.finditer(text), 1):
        if count == chunks:
            return found.end()
    return None


def _cuttable(tokenizer: tokenizers.Tokenizer) -> bool:
    """Whether a text's tokens are those of its chunks between spaces, each giving one token at least: BERT's
    normaliser (character by character), its pre-tokeniser (which splits at every space) and WordPiece (one token or
    more per word, [UNK] for a word it cannot spell). Other tokenizers (byte-level BPE, SentencePiece) keep
    whitespace in their tokens: their texts are not cut."""
    spaced = any(" " in token.content for token in tokenizer.get_added_tokens_decoder().values())
    return (not spaced and isinstance(tokenizer.model, models.WordPiece)
            and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
            and isinstance(tokenizer.normalizer, normalizers.BertNormalizer | None))
