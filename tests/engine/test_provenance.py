"""Per-token provenance: which proposer (or the target) produced each committed token, and which
piece of the text each token wrote, exact under held-back stop-string text and split characters."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.decoding.detokenizer import IncrementalDetokenizer
from specdec_core.engine.provenance import TARGET, TextProvenance, token_sources
from tests.helpers.models import load

TEXT = "Grüße 👋🏽 from 東京! naïve café def f(x):\n    return x  # ок 🤖🤖 the end"
SOURCES = ["draft", "ngram", "suffix", TARGET]


@pytest.fixture(scope="module")
def tok(smol_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smol_tokenizer_dir))


def attributed(tok, ids: list[int], sources: list[str], chunks: list[int], stop: list[str]) -> list[tuple[str, str]]:
    """Feed ``ids`` in steps of the given sizes; every character emitted, with its source."""
    detok, prov = IncrementalDetokenizer(tok, stop), TextProvenance()
    chars: list[tuple[str, str]] = []
    pos = i = 0
    while pos < len(ids):
        n = chunks[i % len(chunks)]
        i += 1
        delta, n_kept, pieces = prov.add(detok, ids[pos:pos + n], sources[pos:pos + n])
        assert "".join(p.text for p in pieces) == delta
        chars += [(c, p.source) for p in pieces for c in p.text]
        if n_kept is not None:
            return chars
        pos += n
    delta, pieces = prov.flush(detok, sources[-1] if sources else TARGET)
    assert "".join(p.text for p in pieces) == delta
    return chars + [(c, p.source) for p in pieces for c in p.text]


def test_token_sources_accepted_drafts_then_the_target() -> None:
    assert token_sources(4, 3, "draft") == ["draft"] * 3 + [TARGET]
    assert token_sources(2, 3, "suffix") == ["suffix"] * 2  # cut by a stop before the target's token
    assert token_sources(1, 0, None) == [TARGET]
    assert token_sources(3, 0, "ngram") == [TARGET] * 3


def test_each_token_owns_the_text_it_wrote(tok) -> None:
    words = ["Hello", " world", ",", " café", "!"]
    ids = [tok.encode(w, add_special_tokens=False) for w in words]
    flat = [t for group in ids for t in group]
    sources = [src for group, src in zip(ids, SOURCES * 2) for _ in group]
    chars = attributed(tok, flat, sources, [3], [])
    got = "".join(c for c, _ in chars)
    assert got == "Hello world, café!"
    expect = [src for w, src in zip(words, SOURCES * 2) for _ in w]
    assert [s for _, s in chars] == expect


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_attribution_does_not_depend_on_steps_or_held_back_text(tok, data) -> None:
    """Whatever the step sizes, and whether text is held back for a stop string, each emitted
    character has the source it has when tokens arrive one by one with no stop string."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    start = data.draw(st.integers(0, len(ids) - 1))
    ids = ids[start:start + data.draw(st.integers(1, 40))]
    sources = data.draw(st.lists(st.sampled_from(SOURCES), min_size=len(ids), max_size=len(ids)))
    chunks = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    reference = attributed(tok, ids, sources, [1], [])
    full = tok.decode(ids, skip_special_tokens=True)
    assert "".join(c for c, _ in reference) == full
    stop: list[str] = []
    if data.draw(st.booleans()):
        a = data.draw(st.integers(0, len(full) - 1))
        stop = [full[a:a + data.draw(st.integers(1, 8))]]
        if "\ufffd" in stop[0]:  # an invalid byte run is not text a stop string can name
            stop = []
    got = attributed(tok, ids, sources, chunks, stop)
    cut = full.index(stop[0]) if stop else len(full)
    assert got == reference[:cut]


@pytest.fixture(scope="module")
def draft_engine(tiny_target, tiny_draft):
    cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=4, adaptive_speculation=False, seed=0, quantize="none")
    return Engine.from_loaded(cfg, load(tiny_target), load(tiny_draft, role="draft"))


def deltas(eng: Engine, prompt: str, params: SamplingParams) -> list:
    req = eng.make_request(prompt, params)
    eng.add_request(req)
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.request_id == req.request_id]
    return outs


@pytest.mark.parametrize("stop", [[], [" the"]])
def test_engine_deltas_carry_sources_and_provenance_without_changing_the_output(draft_engine, stop) -> None:
    base = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=stop)
    plain = deltas(draft_engine, "The capital of France is", base)
    traced = deltas(draft_engine, "The capital of France is", SamplingParams(**{**base.__dict__, "provenance": True}))
    assert [o.token_ids for o in traced] == [o.token_ids for o in plain]
    assert [o.text for o in traced] == [o.text for o in plain]
    for out in plain + traced:
        assert len(out.sources) == len(out.token_ids)
        assert set(out.sources) <= {"draft", TARGET}
    assert all(o.provenance is None for o in plain)
    for out in traced:
        assert "".join(p.text for p in out.provenance) == out.text
    # Every verify step ends with the target's own token; the tiny pair agrees often enough that
    # some drafts are accepted, and their text is attributed to the draft model.
    steps = [o for o in traced if o.token_ids]
    assert all(o.sources[-1] == TARGET for o in steps if not o.finished)
    assert any(s == "draft" for o in traced for s in o.sources)
    assert any(p.source == "draft" and p.text for o in traced for p in o.provenance)


def test_renderers_put_each_deltas_pieces_on_its_first_chunk_even_when_tool_markup_is_held_back(tok) -> None:
    """With tools the call parser may hold a delta's text back (no chunk of its own): its pieces
    still go out, on an empty content chunk, so none is lost; without tools they are the content."""
    from server.openai.bodies import TokenText
    from server.openai.renderers import ChatRenderer, CompletionRenderer
    from server.tools.schema import Tool
    from server.tools.tool_use import ToolUse
    from specdec_core.engine.provenance import TextPiece
    from tests.helpers.answers import rendered

    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    words = text.split(" ")
    deltas = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    tool_use = ToolUse.from_request([Tool.model_validate(tool)], "auto", False, tok)
    renderers = [ChatRenderer(TokenText(tok), False, tool_use), ChatRenderer(TokenText(tok), False),
                 CompletionRenderer(TokenText(tok), False)]
    pieces = [[TextPiece(delta, SOURCES[i % len(SOURCES)])] for i, delta in enumerate(deltas)]
    for renderer in renderers:
        sent = []
        for i, chunks in enumerate(rendered(renderer, deltas, None, pieces)):
            assert chunks and chunks[0]["provenance"] == [{"text": deltas[i], "source": pieces[i][0].source}]
            assert all("provenance" not in c for c in chunks[1:])
            if not (isinstance(renderer, ChatRenderer) and renderer.tools):
                assert chunks[0].get("text", chunks[0].get("delta", {}).get("content")) == deltas[i]
            sent += chunks[0]["provenance"]
        assert "".join(p["text"] for p in sent) == text
        assert rendered(renderer, [""], None, [[]]) == [[]]
