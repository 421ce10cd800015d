"""Hardening against hostile or careless requests (issue 13): bounded stop-string work, per-request
limits, nothing user-sized on the event loop, and no control tokens smuggled in through chat content.

Work is measured by counting (bytecodes, automaton transitions, ids), never by the clock.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import specdec_core
from specdec_core.detokenizer import IncrementalDetokenizer

TEXT = "Grüße 👋🏽 from 東京! naïve café — ∑x² ✓ 🤖🤖 def f(x):\n    return x  # ок ünïcödé"
CORE_DIR = str(Path(specdec_core.__file__).parent)


@pytest.fixture(scope="module")
def tok(smol_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smol_tokenizer_dir))


# -- stop strings: work per step bounded by the new text -----------------------------------------------


def count_bytecodes(fn, *args):
    """``(fn(*args), bytecodes executed in specdec_core's own code)``: the Python-level work of a
    call, excluding the tokenizer's (``decode``) and independent of the machine's speed."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def on_call(frame, event, arg):
        if frame.f_code.co_filename.startswith(CORE_DIR):
            frame.f_trace_opcodes = True
            return local
        return None

    sys.settrace(on_call)
    try:
        result = fn(*args)
    finally:
        sys.settrace(None)
    return result, count


def feed(tok, ids: list[int], stop: list[str], chunk: int) -> tuple[str, int | None, list[int]]:
    """Feed ``ids`` ``chunk`` tokens per step; return (text, tokens kept or None, work per step)."""
    detok = IncrementalDetokenizer(tok, stop)
    out, work = [], []
    for pos in range(0, len(ids), chunk):
        (delta, n_kept), n = count_bytecodes(detok.add, ids[pos:pos + chunk])
        out.append(delta)
        work.append(n)
        if n_kept is not None:
            return "".join(out), pos + n_kept, work
    out.append(detok.flush())
    return "".join(out), None, work


def test_stop_string_work_per_step_does_not_grow_with_the_stops_or_the_output(tok) -> None:
    """64 long stop strings that keep almost matching the output cost what one stop string costs:
    the old check looped over (stops x held-back text) in Python on every step."""
    ids = tok.encode(TEXT * 4, add_special_tokens=False)
    full = tok.decode(ids, skip_special_tokens=True)
    # Each is a 60-character stretch of the output plus a character it never contains: every one of
    # them is partly matched again and again, and none ever completes.
    many = [full[i:i + 60] + "\x00" for i in range(0, 64 * 3, 3)]
    one_text, one_kept, one_work = feed(tok, ids, ["\x00never"], chunk=3)
    many_text, many_kept, many_work = feed(tok, ids, many, chunk=3)
    assert one_text == many_text == full and one_kept is many_kept is None
    assert sum(many_work) <= 1.25 * sum(one_work), (sum(many_work), sum(one_work))
    # Nor does a step cost more as the output grows: the second half costs what the first does.
    half = len(many_work) // 2
    assert sum(many_work[half:2 * half]) <= 1.25 * sum(many_work[:half])


def test_stop_automaton_transitions_are_at_most_twice_the_characters(tok) -> None:
    """The scanner's own transition count: at most 2 per character fed, whatever the stop strings."""
    ids = tok.encode(TEXT * 4, add_special_tokens=False)
    full = tok.decode(ids, skip_special_tokens=True)
    stops = [full[i:i + 300] + "\x00" for i in range(0, 3000, 7)]
    detok = IncrementalDetokenizer(tok, stops)
    out = [detok.add(ids[pos:pos + 2])[0] for pos in range(0, len(ids), 2)]
    assert "".join(out) + detok.flush() == full
    assert detok.stops is not None and detok.stops.work <= 2 * len(full)


def first_stop_reference(text: str, stops: list[str]) -> str:
    """The specification: cut where a stop string first appears (the one ending first, and of those
    ending there, the longest)."""
    for end in range(1, len(text) + 1):
        hits = [len(s) for s in stops if text[:end].endswith(s)]
        if hits:
            return text[: end - max(hits)]
    return text


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_where_the_text_stops_does_not_depend_on_how_tokens_arrive(tok, chunk) -> None:
    """Speculation commits several tokens per step, plain decoding one: both must stop at the same
    place. The old search cut at the stop string *starting* first within a step, so a long stop
    string arriving whole beat a short one inside it that one-token steps had already stopped at."""
    ids = tok.encode("one two three four five six", add_special_tokens=False)
    stops = ["one two three", "two", "ee fo"]
    text, n_kept, _ = feed(tok, ids, stops, chunk)
    assert text == first_stop_reference(tok.decode(ids), stops) == "one "
    assert n_kept == len(tok.encode("one two", add_special_tokens=False))
