"""Structured output in the engine: grammar masks on draft and target rows, speculation kept
lossless with respect to the *constrained* target.

- greedy constrained output is token-identical with speculation off, draft, n-gram and auto, batched
  or alone, and every output parses and validates against its schema;
- sampled constrained output passes a chi-square test against the exactly enumerated constrained
  distribution of a tiny model (negative control: a biased verifier fails it);
- the grammar state rolls back exactly: masks after any drafts equal those of a fresh state that
  committed the same tokens;
- ``logit_bias`` and ``min_tokens`` are warping rules shared by draft and target rows.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

import specdec_core.speculation.verifier as verifier_module
from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.decoding.sampling import RowParams, warp
from specdec_core.decoding.structured_output import StructuredOutput
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.speculation.ngram import NgramProposer
from tests.helpers.distribution import SAMPLES, VOCAB, biased_verify, build_small_vocab_model, chi_square_p
from tests.helpers.models import load
from tests.helpers.runners import region, slot_runner

# Finite by construction (enums, booleans, bounded arrays, bounded whitespace runs): even a random
# model must finish it, so every output can be checked against the schema.
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 3},
    },
    "required": ["colour", "ok", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Answer in JSON:", "The capital of France is", "1, 2, 3, 4, 5,", "def f(x):\n    return"]


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    return load(tiny_target), load(tiny_draft, role="draft")


def engine(pair, method: str, k: int = 4, **kw) -> Engine:
    target, draft = pair
    cfg = EngineConfig(speculative_method=method, num_speculative_tokens=k, adaptive_speculation=False, seed=0,
                       quantize="int8", **kw)
    return Engine.from_loaded(cfg, target, draft if method in ("draft", "auto") else None)


def test_greedy_constrained_output_is_identical_with_speculation_and_valid(pair):
    params = SamplingParams(max_tokens=200, temperature=0.0, structured=StructuredOutput(json_schema=SCHEMA))
    off = engine(pair, "none").generate(PROMPTS, params)
    for c in off:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)
    for method in ("draft", "ngram", "suffix", "auto"):
        eng = engine(pair, method)
        assert [c.token_ids for c in eng.generate(PROMPTS, params)] == [c.token_ids for c in off], method
        # alone (a batch of one) too: masks depend on nothing but the request's own tokens
        assert eng.generate(PROMPTS[:1], params)[0].token_ids == off[0].token_ids
        if method == "suffix":  # the second run finds the first run's outputs in the global trie
            assert eng.metrics.accepted_tokens_by_source.get("suffix", 0) > 0
        if method not in ("ngram", "suffix"):
            assert eng.metrics.total_accepted_tokens > 0, method


def test_constrained_and_free_requests_share_a_batch(pair):
    """A constrained request beside unconstrained ones: each gets what it gets alone."""
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    structured = SamplingParams(max_tokens=200, temperature=0.0, structured=StructuredOutput(json_schema=SCHEMA))
    eng = engine(pair, "auto")
    alone = [eng.generate([p], sp)[0].token_ids for p, sp in zip(PROMPTS, [free, structured, free, structured])]
    mixed = eng.generate(PROMPTS, [free, structured, free, structured])
    assert [c.token_ids for c in mixed] == alone


def test_json_object_output_is_a_json_object(pair):
    """Any JSON object. A random model rambles inside strings, so not every output closes within
    the budget: those that stop parse as objects, the others are valid prefixes of one."""
    eng = engine(pair, "draft")
    close = eng.tokenizer.encode('"}', add_special_tokens=False)
    # One seed per request: how many outputs close within the budget depends on the draws, and a
    # single seed shared by all (as before) made the count all-or-nothing per prompt.
    params = [SamplingParams(max_tokens=48, temperature=1.0, seed=i, logit_bias={t: 6.0 for t in close},
                             structured=StructuredOutput(json_object=True)) for i in range(len(PROMPTS) * 8)]
    out = eng.generate(PROMPTS * 8, params)
    grammar = eng.compile_structured(StructuredOutput(json_object=True))
    for c in out:
        assert c.text.lstrip().startswith("{"), c.text
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict), c.text
        else:
            assert grammar.new_state().valid_prefix(c.token_ids) == len(c.token_ids)
    assert sum(c.finish_reason == "stop" for c in out) >= 4


def test_an_uncompilable_spec_is_a_value_error_that_says_why(pair):
    eng = engine(pair, "none")
    with pytest.raises(ValueError, match="strang"):
        eng.compile_structured(StructuredOutput(json_schema={"type": "strang"}))
    with pytest.raises(ValueError, match="unclosed group"):
        eng.make_request("x", SamplingParams(structured=StructuredOutput(json_schema={"type": "string", "pattern": "(a"})))


def random_walks(grammar, eos_ids: set[int], walks: int, seed: int = 0) -> None:
    """Random draft / verify / commit cycles: every mask equals the mask of a fresh state that
    committed the same tokens, so no step leaves stale drafts behind."""
    rng = random.Random(seed)

    def pick(mask: torch.Tensor) -> int:
        return rng.choice(mask.nonzero().flatten().tolist())

    for _ in range(walks):
        state, committed = grammar.new_state(), []
        while not state.finished:
            drafts: list[int] = []
            for _ in range(rng.randint(0, 4)):
                drafts.append(pick(state.mask(drafts)))
            state.mask(drafts[:1])  # the verifier revisits earlier rows
            keep = rng.randint(0, len(drafts))
            step = drafts[:keep] + [pick(state.mask(drafts[:keep]))]
            step = step[: state.commit(step)]
            committed += step
            fresh = grammar.new_state()
            fresh.commit(committed)
            assert torch.equal(state.mask([]), fresh.mask([])), committed
            if any(t in eos_ids for t in step):
                break


def test_grammar_state_follows_drafts_and_commits_exactly(pair):
    eng = engine(pair, "none")
    random_walks(eng.compile_structured(StructuredOutput(json_schema=SCHEMA)), eng.eos_ids, walks=5)


def test_ngram_lookups_are_cut_where_the_grammar_rejects_them(pair):
    eng = engine(pair, "ngram")
    req = eng.make_request("x", SamplingParams(structured=StructuredOutput(json_schema=SCHEMA)))
    opening = eng.tokenizer.encode('{"colour": "red"', add_special_tokens=False)
    assert req.grammar.valid_prefix(opening + opening) == len(opening)
    req.all_ids = list(req.prompt_ids) + opening + [0] + opening[:2]
    req.ngram.lookup(req.all_ids, 0)
    assert NgramProposer.lookup(req, 8) == []  # after '{"' a second '{"colour"...' cannot follow


def test_suffix_lookups_are_cut_where_the_grammar_rejects_them(pair):
    eng = engine(pair, "suffix")
    req = eng.make_request("x", SamplingParams(structured=StructuredOutput(json_schema=SCHEMA)))
    opening = eng.tokenizer.encode('{"colour": "red"', add_special_tokens=False)
    req.all_ids = list(req.prompt_ids) + opening + [0] + opening[:2]
    free = eng.make_request("y", SamplingParams())
    free.all_ids = list(req.all_ids)
    assert eng.suffix.lookup(free, 8)[:2] == opening[2:4]  # without the grammar the trie proposes the repeat
    assert eng.suffix.lookup(req, 8) == []  # the grammar cuts it: a second '{"colour"...' cannot follow


def test_logit_bias_and_min_tokens_hold_under_speculation(pair):
    """+100 on EOS makes it the argmax everywhere; min_tokens holds it back for 5 tokens, identically
    with and without speculation (the same rules warp draft and target rows)."""
    eng = engine(pair, "none")
    eos = sorted(eng.eos_ids)[0]
    params = SamplingParams(max_tokens=20, temperature=0.0, logit_bias={eos: 100.0}, min_tokens=5)
    off = eng.generate(PROMPTS, params)
    assert all(len(c.token_ids) == 6 and c.token_ids[-1] == eos and c.finish_reason == "stop" for c in off)
    for method in ("draft", "ngram"):
        assert [c.token_ids for c in engine(pair, method).generate(PROMPTS, params)] == [c.token_ids for c in off]
    banned = SamplingParams(max_tokens=8, temperature=0.0, logit_bias={t: -100.0 for t in off[0].token_ids[:1]})
    assert engine(pair, "draft").generate(PROMPTS[:1], banned)[0].token_ids[0] != off[0].token_ids[0]


# ---------------------------------------------------------------------------------------- sampling

# Token-level grammar over a 16-token vocabulary (t15 is EOS): the second token's allowed set
# depends on the first, so masks change along the drafts.
ALLOWED_FIRST = {1: [4, 5], 2: [6, 7, 1], 3: [8]}
LARK = "start: " + " | ".join(
    f"<[{a}]> (" + " | ".join(f"<[{b}]>" for b in bs) + ")" for a, bs in ALLOWED_FIRST.items()
)


@pytest.fixture(scope="module")
def vocab16_pair(tmp_path_factory):
    """The distribution test's 16-token pair, with t15 as EOS and a decoder llguidance can read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.ByteLevel()
    tok_dir = tmp_path_factory.mktemp("tok16eos")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t15").save_pretrained(tok_dir)
    target = load(build_small_vocab_model(tmp_path_factory.mktemp("t16g"), 0, tok_dir))
    draft = load(build_small_vocab_model(tmp_path_factory.mktemp("d16g"), 0, tok_dir, noise=0.5), role="draft")
    return target, draft


def _mask(ids: list[int]) -> torch.Tensor:
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[ids] = True
    return allowed


def exact_constrained_distribution(model, params: SamplingParams, prompt: list[int]) -> torch.Tensor:
    """P(t1, t2 | prompt) of the target restricted (before warping) to the grammar's tokens."""
    run = slot_runner(model, VOCAB + 1, 16, vocab_size=VOCAB, quantize="int8")
    first = list(ALLOWED_FIRST)
    p1 = warp(run.forward([ForwardItem(region(VOCAB, 16), 0, prompt, 1)]), [RowParams(params, allowed=_mask(first))])[0]
    logits = run.forward([ForwardItem(region(t, 16), 0, prompt + [t], 1, num_drafts=1) for t in first])
    p2 = warp(logits, [RowParams(params, allowed=_mask(ALLOWED_FIRST[t])) for t in first])
    joint = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for i, t in enumerate(first):
        joint[t] = p1[t].double() * p2[i].double()
    return joint.flatten()


def draw_constrained(target, draft, params: SamplingParams, prompt: list[int]) -> torch.Tensor:
    cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=2, adaptive_speculation=False,
                       max_num_seqs=256, max_model_len=16, prefill_chunk_size=2048, seed=1234, quantize="int8")
    eng = Engine.from_loaded(cfg, target, draft)
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    for c in eng.generate([prompt] * SAMPLES, params):
        assert len(c.token_ids) == 2 and c.finish_reason == "stop", c.token_ids
        counts[c.token_ids[0] * VOCAB + c.token_ids[1]] += 1
    m = eng.metrics
    # Both drafts are verified, some rejected, some all accepted: every branch of the rule runs.
    assert m.total_draft_tokens >= 2 * SAMPLES
    assert m.accepted_histogram[0] > 0 and m.accepted_histogram[2] > 0
    return counts


@pytest.mark.slow
def test_constrained_samples_match_the_constrained_target(vocab16_pair, monkeypatch):
    target, draft = vocab16_pair
    params = SamplingParams(max_tokens=4, temperature=1.0, structured=StructuredOutput(lark=LARK))
    prompt = [3, 7, 1]
    probs = exact_constrained_distribution(target.model, params, prompt)
    counts = draw_constrained(target, draft, params, prompt)
    assert chi_square_p(counts, probs) > 1e-3

    # Negative control: the same test rejects a sampler that is wrong after a rejection.
    monkeypatch.setattr(verifier_module, "verify", biased_verify)
    assert chi_square_p(draw_constrained(target, draft, params, prompt), probs) < 1e-3


def test_the_sampling_test_grammar_is_what_it_claims(vocab16_pair):
    """The enumeration above assumes LARK allows exactly ALLOWED_FIRST: check it on the engine."""
    target, _ = vocab16_pair
    eng = Engine.from_loaded(EngineConfig(speculative_method="none", adaptive_speculation=False), target)
    state = eng.compile_structured(StructuredOutput(lark=LARK)).new_state()
    assert state.mask([]).nonzero().flatten().tolist() == sorted(ALLOWED_FIRST)
    for first, second in ALLOWED_FIRST.items():
        assert state.mask([first]).nonzero().flatten().tolist() == sorted(second)
        assert state.mask([first, second[0]]).nonzero().flatten().tolist() == [15]  # only EOS


def test_grammar_state_survives_drafts_past_a_forced_end(vocab16_pair):
    """Short grammars whose second token is forced and completes them: the case in which
    llguidance's own rollback went wrong (see ``GrammarState``)."""
    target, _ = vocab16_pair
    eng = Engine.from_loaded(EngineConfig(speculative_method="none", adaptive_speculation=False), target)
    random_walks(eng.compile_structured(StructuredOutput(lark=LARK)), eng.eos_ids, walks=300)
