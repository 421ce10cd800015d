"""Incremental detokenization with stop strings.

Deltas never end inside a multi-byte character (the decoder's U+FFFD replacement is held back) and
never show text that might turn out to be the start of a stop string; concatenated they equal
``tokenizer.decode(generated_ids, skip_special_tokens=True)`` cut before the first stop string.

The work per step does not grow with the output: each step decodes only a short window of tokens
(as vLLM's ``detokenize_incrementally`` does). ``prefix_offset:read_offset`` are the tokens of the
previous step, decoded again only as context (a SentencePiece decoder drops the leading space of a
window's first token, and a window must start on a character boundary); the text the new tokens
add is the window's decode minus that prefix's decode. The window only moves on once its text ends
on a whole character, so it spans more than the last step's tokens only while a character is
incomplete (at most 3 bytes of valid UTF-8).

Stop strings (``specdec_core.decoding.stop_strings``) are found by an automaton that reads each new
character once, so their cost per step is that of the new text, whatever their number or length.
The text held back is the longest end of the output that may still begin a stop string. The text
is cut at the first point where any stop string has appeared (the one that ends first; of those
ending there, the longest), which does not depend on how tokens were grouped into steps, so
speculation (several tokens per step) and plain decoding stop at the same place.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import tokenizers
from transformers import PreTrainedTokenizerBase

from specdec_core.decoding.stop_strings import StopScanner

REPLACEMENT_CHAR = "\ufffd"


def text_of(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=True)`` as a function of ``ids``.

    For a fast tokenizer that does no clean-up of the text (every tokenizer specdec has met), the
    Rust tokenizer's own ``decode``: the same text without transformers' argument conversion
    around it, which cost more than the decoding itself (a request decodes a few short windows
    per step)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if isinstance(backend, tokenizers.Tokenizer) and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return partial(backend.decode, skip_special_tokens=True)
    return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True))


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self._text_of = text_of(tokenizer)
        self.stops = StopScanner(stop) if stop else None
        self.token_ids: list[int] = []
        self._pieces: list[str] = []  # the deltas returned so far
        self._prefix_offset = 0
        self._read_offset = 0
        self._consumed = 0  # characters past the prefix text already taken from the current window
        self._pending = ""  # scanned text held back (it may be the start of a stop string)

    @property
    def emitted(self) -> str:
        """All the text returned so far (joined on demand: only the end of a request asks)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def held_chars(self) -> int:
        """Characters already decoded but held back (they may begin a stop string): the next
        deltas start with them (``specdec_core.engine.provenance`` tracks whose they are)."""
        return len(self._pending)

    def _decode(self, ids: list[int]) -> str:
        return self._text_of(ids) if ids else ""

    def add(self, new_ids: list[int]) -> tuple[str, int | None]:
        """Add tokens; return ``(delta_text, n_kept)``.

        ``n_kept`` is None when no stop string appeared; otherwise the stop string was completed by
        the ``n_kept``-th new token, the tokens after it are dropped, and the text is final.
        """
        start = len(self.token_ids)
        prefix = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        self.token_ids += new_ids
        window = self._decode(self.token_ids[self._prefix_offset:])
        new_text = self._new_text(window, prefix)
        if self.stops is not None:
            hit = self.stops.feed(new_text)
            if hit is not None:
                end, length = hit
                n_kept = self._tokens_to_reach(start, new_ids, prefix, end)
                del self.token_ids[start + n_kept:]
                unsent = self._pending + new_text[:end]
                return self._emit(unsent[: len(unsent) - length]), n_kept
        self._advance(window, prefix, new_text)
        unsent = self._pending + new_text
        # The held-back text is exactly the scanner's depth: it never reaches back into sent text.
        keep = self.stops.held if self.stops is not None else 0
        self._pending = unsent[len(unsent) - keep:] if keep else ""
        return self._emit(unsent[: len(unsent) - keep]), None

    def flush(self) -> str:
        """Emit whatever was held back (the request has finished without a stop string)."""
        prefix = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        window = self._decode(self.token_ids[self._prefix_offset:])
        rest = window[len(prefix) + self._consumed:]
        text, self._pending = self._pending + rest, ""
        self._prefix_offset = self._read_offset = len(self.token_ids)
        self._consumed = 0
        return self._emit(text)

    def _advance(self, window: str, prefix: str, new_text: str) -> None:
        if len(self.token_ids) == self._read_offset:
            return  # nothing new: keep the prefix (an empty one would lose a SentencePiece leading space)
        if not window.endswith(REPLACEMENT_CHAR):
            # The window ends on a whole character: the next one starts at this step's tokens.
            self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
            self._consumed = 0
        else:
            self._consumed += len(new_text)
            self._move_to_last_boundary(prefix)

    def _move_to_last_boundary(self, prefix: str) -> None:
        """Start the next window at the last whole character among the last few tokens.

        A character left incomplete comes from at most 3 tokens (4 bytes, at least one per token),
        so this keeps the window from growing while chunks keep ending mid-character. (A run of
        invalid bytes or skipped special tokens has no such boundary: the window then grows until
        the text ends on a whole character again.)
        """
        ids = self.token_ids
        for j in range(len(ids) - 1, max(self._read_offset, len(ids) - 4), -1):
            head = self._decode(ids[self._prefix_offset:j])
            if not head.endswith(REPLACEMENT_CHAR):
                taken = len(prefix) + self._consumed  # characters of the window already taken
                self._prefix_offset, self._read_offset = self._read_offset, j
                self._consumed = taken - len(head)
                return

    def _new_text(self, window: str, prefix: str) -> str:
        """Whole characters the window adds beyond its prefix and what was taken from it before."""
        return window.rstrip(REPLACEMENT_CHAR)[len(prefix) + self._consumed:]

    def _tokens_to_reach(self, start: int, new_ids: list[int], prefix: str, end: int) -> int:
        """How many of the new tokens it takes for the new text to reach ``end`` characters."""
        for n in range(1, len(new_ids)):
            window = self._decode(self.token_ids[self._prefix_offset:start + n])
            if len(self._new_text(window, prefix)) >= end:
                return n
        return len(new_ids)

    def _emit(self, delta: str) -> str:
        if delta:
            self._pieces.append(delta)
        return delta
