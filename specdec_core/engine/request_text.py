"""The text of a request's committed tokens: detokenized incrementally (UTF-8 safe, stop strings
held back until they are decided), and split by the source of each token when the request asked
for provenance.

``RequestText`` is a part of the engine's ``Request`` (a base class of it): the detokenizer and
the provenance move only through ``add_text`` and ``flush_text``, which only the commit calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only
    from specdec_core.decoding.detokenizer import IncrementalDetokenizer
    from specdec_core.engine.provenance import TextPiece, TextProvenance


class RequestText:
    """The text state of one request (a base of ``engine.request.Request``, which sets the
    attributes below)."""

    detokenizer: IncrementalDetokenizer
    # Whose text the detokenizer holds back (None: the request did not ask for provenance).
    provenance: TextProvenance | None

    def add_text(self, ids: list[int], sources: list[str]) -> tuple[str, int | None, list[TextPiece] | None]:
        """Detokenize committed tokens: ``(delta, n_kept, pieces)``, ``n_kept`` as the detokenizer's
        (a stop string ended the text at that token), ``pieces`` the delta by source when the
        request asked for provenance (None otherwise)."""
        if self.provenance is None:
            return (*self.detokenizer.add(ids), None)
        return self.provenance.add(self.detokenizer, ids, sources)

    def flush_text(self, last_source: str) -> tuple[str, list[TextPiece] | None]:
        """The text held back at the end (no stop string ended it), as ``add_text`` gives it."""
        if self.provenance is None:
            return self.detokenizer.flush(), None
        return self.provenance.flush(self.detokenizer, last_source)
