"""The incremental detokenizer on SmolLM2's real tokenizer: equal to the full decode, bounded work."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_core.decoding.detokenizer import IncrementalDetokenizer, text_of

TEXT = "Grüße 👋🏽 from 東京! naïve café — ∑x² ✓ 🤖🤖 def f(x):\n    return x  # ок ünïcödé"


@pytest.fixture(scope="module")
def tok(smol_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smol_tokenizer_dir))


@pytest.fixture(scope="module")
def pool(tok) -> list[int]:
    """Ids that exercise the hard cases: real words, the single-byte tokens of multi-byte characters
    (incomplete on their own), special tokens (skipped) and the rest of the vocabulary."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    byte_ids = [i for i in range(len(tok)) if "\ufffd" in tok.decode([i])][:200]
    assert byte_ids, "the tokenizer has no partial-character tokens to test with"
    return ids + byte_ids + list(tok.all_special_ids) + list(range(0, len(tok), 97))


def test_text_of_is_the_tokenizers_decode_with_or_without_its_clean_up(tok, pool) -> None:
    """The Rust decoder stands in for ``tokenizer.decode`` only where the text is the same: a
    tokenizer that cleans up its text keeps transformers' decode."""
    import copy

    ids = pool[:120] + tok.encode("a , b . c 's ?", add_special_tokens=False)
    assert text_of(tok)(ids) == tok.decode(ids, skip_special_tokens=True)
    cleaning = copy.deepcopy(tok)
    cleaning.clean_up_tokenization_spaces = True
    assert text_of(cleaning)(ids) == cleaning.decode(ids, skip_special_tokens=True)


def run(tok, ids: list[int], chunks: list[int], stop: list[str]) -> tuple[str, int | None, int]:
    """Feed ``ids`` in chunks of the given sizes; return (joined deltas, tokens kept, tokens fed)."""
    detok = IncrementalDetokenizer(tok, stop)
    deltas, pos, i = [], 0, 0
    while pos < len(ids):
        n = chunks[i % len(chunks)]
        i += 1
        new = ids[pos:pos + n]
        delta, n_kept = detok.add(new)
        # Only an invalid byte sequence in the output itself (then the full decode has it too) may
        # put U+FFFD at the end of a delta; a character split across tokens never does.
        assert not delta.endswith("\ufffd") or "\ufffd" in tok.decode(ids, skip_special_tokens=True)
        deltas.append(delta)
        if n_kept is not None:
            return "".join(deltas), pos + n_kept, pos + len(new)
        pos += len(new)
    deltas.append(detok.flush())
    return "".join(deltas), None, pos


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_deltas_equal_the_full_decode_cut_before_the_first_stop(tok, pool, data) -> None:
    ids = data.draw(st.lists(st.sampled_from(pool), max_size=60))
    chunks = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    full = tok.decode(ids, skip_special_tokens=True)
    stop: list[str] = []
    if full and data.draw(st.booleans()):
        a = data.draw(st.integers(0, len(full) - 1))
        stop = [full[a:a + data.draw(st.integers(1, 6))]]
        if "\ufffd" in stop[0]:
            stop = []
    text, n_kept, _ = run(tok, ids, chunks, stop)
    if not stop:
        assert n_kept is None and text == full
        return
    assert n_kept is not None, f"stop {stop!r} in {full!r} not found"
    assert text == full[: full.index(stop[0])]
    # The kept tokens are exactly those up to the one that completed the stop string.
    assert stop[0] in tok.decode(ids[:n_kept], skip_special_tokens=True)
    assert stop[0] not in tok.decode(ids[:n_kept - 1], skip_special_tokens=True)


def test_a_stop_string_spanning_tokens_is_found_and_later_tokens_dropped(tok) -> None:
    ids = tok.encode("one two three four five", add_special_tokens=False)
    text, n_kept, _ = run(tok, ids, [1], ["ree fo"])
    assert text == "one two th"
    assert tok.decode(ids[:n_kept]).endswith(tok.decode(ids[n_kept - 1:n_kept]))
    assert "ree fo" in tok.decode(ids[:n_kept]) and "ree fo" not in tok.decode(ids[:n_kept - 1])


def test_text_that_may_start_a_stop_string_is_held_back(tok) -> None:
    detok = IncrementalDetokenizer(tok, ["STOP"])
    delta, _ = detok.add(tok.encode("hello ST", add_special_tokens=False))
    assert delta == "hello "
    delta, n_kept = detok.add(tok.encode("ART", add_special_tokens=False))
    assert n_kept is None and delta == "START"


@pytest.mark.parametrize("chunk", [1, 5])
def test_work_per_step_does_not_grow_with_the_output(tok, chunk) -> None:
    """Count the token ids handed to ``decode`` per ``add``: bounded by a constant, not by the
    length of the output (the old detokenizer decoded the whole output every step)."""
    ids = tok.encode(TEXT * 40, add_special_tokens=False)
    assert len(ids) > 1000
    decoded: list[int] = []
    real = tok.decode

    class Counting:
        def __getattr__(self, name):
            return getattr(tok, name)

        def decode(self, token_ids, **kw):
            decoded.append(len(token_ids))
            return real(token_ids, **kw)

    detok = IncrementalDetokenizer(Counting(), ["no such stop string"])
    per_add, out = [], []
    for pos in range(0, len(ids), chunk):
        decoded.clear()
        out.append(detok.add(ids[pos:pos + chunk])[0])
        per_add.append(sum(decoded))
    out.append(detok.flush())
    assert "".join(out) == tok.decode(ids, skip_special_tokens=True)
    # A window is at most the last step, this step and 3 tokens of an incomplete character; an add
    # decodes it at most 5 times (prefix, window, the search for the last whole character).
    assert max(per_add) <= 5 * (2 * chunk + 6)


def test_an_empty_add_changes_nothing(tok) -> None:
    ids = tok.encode("a café au lait", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    out = []
    for i in ids:
        out.append(detok.add([i])[0])
        out.append(detok.add([])[0])
    out.append(detok.flush())
    assert "".join(out) == "a café au lait"
