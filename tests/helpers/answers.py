"""A renderer fed text deltas as the server feeds it (``server.generation.answer.Answers``), for
tests of one renderer's shapes without a server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.generation.answer import Answers
from server.generation.submission import Choice
from specdec_core.engine.outputs import RequestOutput
from specdec_core.engine.provenance import TextPiece


def rendered(renderer: Any, texts: Sequence[str], finish_reason: str | None = "stop",
             pieces: Sequence[list[TextPiece]] | None = None) -> list[list[dict[str, Any]]]:
    """The chunks ``renderer.update`` sends for each of ``texts`` (choice 0); the last delta ends
    the choice with ``finish_reason`` (None: the choice stays open)."""
    answers, choice = Answers(renderer.tools), Choice(index=0, prompt_tokens=1, counts_prompt=True)
    sent = []
    for i, text in enumerate(texts):
        last = finish_reason is not None and i == len(texts) - 1
        if last:
            choice.finished, choice.finish_reason = True, finish_reason
        out = RequestOutput(request_id="r-0", token_ids=[], text=text, finished=last,
                            finish_reason=finish_reason if last else None,
                            provenance=list(pieces[i]) if pieces is not None else None)
        sent.append(list(renderer.update(answers.update(choice, out))))
    return sent
