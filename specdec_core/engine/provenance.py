"""How each committed token was produced, and which piece of a request's text each token wrote.

Every token a step commits is either a draft the target accepted (its source is the proposer's
name as the speculation policy recorded it: ``"draft"``, ``"ngram"``, or any later proposer) or
the token the target sampled itself: the bonus / correction token that ends every verify pass, and
every token of a step that proposed nothing (``TARGET``). The source is carried as a string, so a
new proposer needs no change here.

Text is attributed to tokens exactly, not guessed from token boundaries: a request that asked for
provenance feeds its detokenizer one token at a time, so each token's delta is the text it made
final (a character split over several tokens belongs to the one that completed it). Text the
detokenizer holds back because it may begin a stop string is emitted later, by another token's
call; ``TextProvenance`` remembers whose it was, so every emitted character keeps its own source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the server imports this module, and the detokenizer imports transformers
    from specdec_core.decoding.detokenizer import IncrementalDetokenizer

TARGET = "target"


@dataclass(frozen=True)
class TextPiece:
    """A piece of a delta's text and the source of the token that wrote it."""

    text: str
    source: str


def token_sources(num_tokens: int, accepted: int, source: str | None) -> list[str]:
    """The sources of a step's first ``num_tokens`` committed tokens: the ``accepted`` drafts come
    from ``source`` (None: nothing was proposed), every token after them from the target."""
    if source is None:
        return [TARGET] * num_tokens
    drafted = min(accepted, num_tokens)
    return [source] * drafted + [TARGET] * (num_tokens - drafted)


class TextProvenance:
    """One request's attribution state: the sources of the text its detokenizer holds back."""

    def __init__(self) -> None:
        # [source, characters] of the held-back text, oldest first: a token's text stays one entry.
        self._held: list[list] = []

    def add(self, detokenizer: IncrementalDetokenizer, ids: list[int], sources: list[str]) -> tuple[str, int | None, list[TextPiece]]:
        """``detokenizer.add(ids)``, one token at a time; also the delta as pieces by source. The
        detokenizer's text does not depend on how tokens are grouped, so the delta and the stop
        point are those of one call."""
        text: list[str] = []
        pieces: list[TextPiece] = []
        for i, (token, source) in enumerate(zip(ids, sources)):
            delta, n_kept = detokenizer.add([token])
            text.append(delta)
            # After a stop string the request ends: what is still held back is never emitted.
            pieces += self._emit(delta, source, 0 if n_kept is not None else detokenizer.held_chars)
            if n_kept is not None:
                return "".join(text), i + n_kept, pieces
        return "".join(text), None, pieces

    def flush(self, detokenizer: IncrementalDetokenizer, source: str) -> tuple[str, list[TextPiece]]:
        """``detokenizer.flush()`` as pieces: the held-back text, then any rest (an incomplete
        character at the very end) from ``source``, the last token's."""
        delta = detokenizer.flush()
        return delta, self._emit(delta, source, 0)

    def _emit(self, delta: str, source: str, held_after: int) -> list[TextPiece]:
        """``delta`` is the front of the held-back text followed by new text from ``source``; the
        ``held_after`` characters held back after it are the rest of the old held text, then new
        text from ``source`` (the detokenizer emits a prefix of held + new and holds the rest)."""
        pieces: list[TextPiece] = []
        pos = 0
        while self._held and pos < len(delta):
            entry = self._held[0]
            take = min(entry[1], len(delta) - pos)
            pieces.append(TextPiece(delta[pos:pos + take], entry[0]))
            pos += take
            entry[1] -= take
            if entry[1] == 0:
                self._held.pop(0)
        if pos < len(delta):
            pieces.append(TextPiece(delta[pos:], source))
        still_held = sum(entry[1] for entry in self._held)
        if held_after > still_held:
            self._held.append([source, held_after - still_held])
        elif held_after == 0:
            self._held.clear()
        return pieces
