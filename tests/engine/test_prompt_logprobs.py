"""Prompt log-probabilities and ``logprobs_mode`` in the engine: computed by the prefill that runs
anyway, equal to the model's own log-softmax, unaffected by chunking or the prefix cache, and
without effect on what is generated."""

from __future__ import annotations

import pytest
import torch

from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.decoding.token_logprob import TokenLogprob
from specdec_core.engine.outputs import RequestOutput
from tests.helpers.engine_runs import run_to_end
from tests.helpers.models import load

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
CHUNK = 8  # several prefill chunks per prompt, and full chunks for the prefix cache


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def engine(pair, **kw) -> Engine:
    target, draft = pair
    cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=3, adaptive_speculation=False, seed=0,
                       quantize="none", prefill_chunk_size=CHUNK, **kw)
    return Engine.from_loaded(cfg, target, draft)


def run(eng: Engine, prompt: str | list[int], params: SamplingParams) -> list[RequestOutput]:
    """Every delta of one request, run to its end."""
    return run_to_end(eng, [prompt], params)[0][1]


def prompt_lps(outs: list[RequestOutput]) -> list[TokenLogprob | None]:
    given = [o.prompt_logprobs for o in outs if o.prompt_logprobs is not None]
    assert len(given) == 1, "prompt log-probabilities come once, with the first delta"
    return given[0]


def reference(pair, ids: list[int]) -> torch.Tensor:
    """log_softmax of the target's logits over ``ids``, from the transformers model itself."""
    model = pair[0].model
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_prompt_logprobs_equal_the_models_own(pair) -> None:
    eng = engine(pair)
    ids = eng.tokenizer.encode(PROMPT)
    assert len(ids) > 3 * CHUNK
    lps = prompt_lps(run(eng, ids, SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=5)))
    ref = reference(pair, ids)
    assert len(lps) == len(ids) and lps[0] is None
    for pos, lp in enumerate(lps[1:], start=1):
        assert lp is not None and lp.token_id == ids[pos]
        assert lp.logprob == pytest.approx(ref[pos - 1, ids[pos]].item(), abs=1e-4)
        values = [v for _, v in lp.top]
        assert len(lp.top) == 5 and values == sorted(values, reverse=True)
        assert [t for t, _ in lp.top] == ref[pos - 1].topk(5).indices.tolist()
        row, own = ref[pos - 1], ref[pos - 1, ids[pos]]
        assert lp.rank is not None  # 1 + tokens more likely, up to near-ties in a random model's tail
        assert int((row > own + 1e-4).sum()) + 1 <= lp.rank <= int((row > own - 1e-4).sum()) + 1
        if lp.rank <= 5:
            assert lp.top[lp.rank - 1][0] == ids[pos]


def test_asking_changes_nothing_generated(pair) -> None:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)
    plain = run(engine(pair), PROMPT, greedy)
    asked = run(engine(pair), PROMPT, SamplingParams(**{**greedy.__dict__, "prompt_logprobs": 0}))
    assert [t for o in plain for t in o.token_ids] == [t for o in asked for t in o.token_ids]
    flat = [(lp.token_id, lp.logprob, lp.top) for o in plain for lp in o.logprobs or []]
    assert flat == [(lp.token_id, lp.logprob, lp.top) for o in asked for lp in o.logprobs or []]
    assert all(o.prompt_logprobs is None for o in plain)


def test_a_cached_prefix_is_recomputed_bit_for_bit(pair) -> None:
    fresh = prompt_lps(run(engine(pair), PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=3)))
    eng = engine(pair)
    first = run(eng, PROMPT + "print(1)", SamplingParams(max_tokens=1))
    assert first[-1].stats is not None and first[-1].stats.cached_tokens == 0
    again = run(eng, PROMPT, SamplingParams(max_tokens=1))
    assert again[-1].stats is not None and again[-1].stats.cached_tokens >= CHUNK  # the cache serves this prefix
    outs = run(eng, PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=3))
    assert outs[-1].stats is not None and outs[-1].stats.cached_tokens == 0
    assert prompt_lps(outs) == fresh  # exact: the same chunks at the same offsets


def test_max_tokens_zero_only_scores_the_prompt(pair) -> None:
    eng = engine(pair)
    outs = run(eng, PROMPT, SamplingParams(max_tokens=0, prompt_logprobs=1))
    assert [t for o in outs for t in o.token_ids] == [] and "".join(o.text for o in outs) == ""
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert len(prompt_lps(outs)) == len(eng.tokenizer.encode(PROMPT))
    assert outs[-1].stats is not None and outs[-1].stats.completion_tokens == 0


def test_processed_logprobs_are_the_law_sampled_from(pair) -> None:
    """Sampled at temperature 0.5 with a logit bias: processed = log_softmax((logits + bias) / T)
    at each emitted token; raw = log_softmax(logits). The tokens do not depend on the mode."""
    bias = {13: 5.0}
    base = dict(max_tokens=8, temperature=0.5, seed=7, ignore_eos=True, logprobs=3, logit_bias=bias)
    raw = run(engine(pair), PROMPT, SamplingParams(**base))
    processed = run(engine(pair), PROMPT, SamplingParams(**base, logprobs_mode="processed_logprobs"))
    tokens = [t for o in raw for t in o.token_ids]
    assert tokens == [t for o in processed for t in o.token_ids]
    ids = engine(pair).tokenizer.encode(PROMPT)
    ref = reference(pair, ids + tokens)[len(ids) - 1:-1]
    biased = ref.clone()
    biased[:, 13] += 5.0
    law = torch.log_softmax(biased / 0.5, dim=-1)
    raw_lps = [lp for o in raw for lp in o.logprobs or []]
    pro_lps = [lp for o in processed for lp in o.logprobs or []]
    for i, (r, p) in enumerate(zip(raw_lps, pro_lps, strict=True)):
        assert r.logprob == pytest.approx(ref[i, tokens[i]].item(), abs=1e-4)
        assert p.logprob == pytest.approx(law[i, tokens[i]].item(), abs=1e-4)
        assert [t for t, _ in p.top] == law[i].topk(3).indices.tolist()


def test_processed_logprobs_never_list_what_a_grammar_forbids(pair) -> None:
    from specdec_core.decoding.structured_output import StructuredOutput

    schema = StructuredOutput(json_schema={"type": "object", "properties": {"a": {"type": "boolean"}},
                                           "required": ["a"], "additionalProperties": False})
    params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=5, structured=schema,
                            logprobs_mode="processed_logprobs")
    eng = engine(pair)
    outs = run(eng, "JSON:", params)
    first = [lp for o in outs for lp in o.logprobs or []][0]
    assert eng.tokenizer.decode([first.token_id]).lstrip().startswith("{")
    assert all(eng.tokenizer.decode([t]).lstrip().startswith("{") for t, _ in first.top)
