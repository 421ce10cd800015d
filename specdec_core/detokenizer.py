"""Incremental detokenization with stop strings.

Deltas never end inside a multi-byte character (the decoder's U+FFFD replacement is held back) and
never show text that might turn out to be the start of a stop string; concatenated they equal
``tokenizer.decode(generated_ids, skip_special_tokens=True)`` cut before the first stop string.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.token_ids: list[int] = []
        self.emitted = ""
        self._hold = max((len(s) for s in stop), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, new_ids: list[int]) -> tuple[str, int | None]:
        """Add tokens; return ``(delta_text, n_kept)``.

        ``n_kept`` is None when no stop string appeared; otherwise the stop string was completed by
        the ``n_kept``-th new token, the tokens after it are dropped, and the text is final.
        """
        start = len(self.token_ids)
        text = self._decode(self.token_ids + new_ids)
        if self.stop:
            # Only text not yet emitted can hold a new stop string (the held-back tail included).
            cut = self._find_stop(text, max(0, len(self.emitted) - self._hold))
            if cut is not None:
                n_kept = self._tokens_to_complete_stop(start, new_ids)
                self.token_ids += new_ids[:n_kept]
                return self._emit(text[:cut], final=True), n_kept
        self.token_ids += new_ids
        return self._emit(text, final=False), None

    def flush(self) -> str:
        """Emit whatever was held back (the request has finished without a stop string)."""
        return self._emit(self._decode(self.token_ids), final=True)

    def _find_stop(self, text: str, search_from: int) -> int | None:
        hits = [i for s in self.stop if (i := text.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _tokens_to_complete_stop(self, start: int, new_ids: list[int]) -> int:
        for n in range(1, len(new_ids) + 1):
            if self._find_stop(self._decode(self.token_ids + new_ids[:n]), 0) is not None:
                return n
        return len(new_ids)

    def _emit(self, text: str, final: bool) -> str:
        if not final:
            if text.endswith(REPLACEMENT_CHAR):
                text = text.rstrip(REPLACEMENT_CHAR)
            if self._hold:
                text = text[: max(len(self.emitted), len(text) - self._hold_len(text))]
        if not text.startswith(self.emitted):
            # The decoder rewrote earlier text (rare clean-up rules); never retract what was sent.
            return ""
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta

    def _hold_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    best = max(best, n)
                    break
        return best
