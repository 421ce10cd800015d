"""Greedy exactness: speculative output is token-identical to the target alone, in every
quantization mode (the forward is batch-invariant, see tests/execution/test_batch_invariance.py)."""

from __future__ import annotations

import pytest
import torch

from specdec_core import Engine, EngineConfig, SamplingParams
from tests.helpers.engine_runs import run_staggered
from tests.helpers.models import drop_layers, load

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The capital of France is",
    "1, 2, 3, 4, 5, 6, 7,",
    "Once upon a time, in a land far away, there lived",
    "import numpy as np\nimport torch\n",
    "Q: What is 2 + 2?\nA:",
    "<html><body><p>Hello</p><p>",
    "the the the the the the",
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
MODES = ["none", "int8"]


@pytest.fixture(scope="module")
def pairs(tiny_model_factory, tiny_target, tiny_draft, tmp_path_factory):
    from tests.helpers.models import truncated_copy

    qwen = tiny_model_factory("qwen2", num_layers=2, hidden=64, seed=3)
    qwen_draft = truncated_copy(qwen, tmp_path_factory.mktemp("qwen_draft"), keep_layers=1)
    return {
        "llama": (load(tiny_target), load(tiny_draft, role="draft")),
        "qwen2": (load(qwen), load(qwen_draft, role="draft")),
    }


def engine(pair, method: str, k: int = 4, quantize: str = "int8", **kw) -> Engine:
    target, draft = pair
    cfg = EngineConfig(speculative_method=method, num_speculative_tokens=k, adaptive_speculation=False, seed=0,
                       quantize=quantize, **kw)
    return Engine.from_loaded(cfg, target, draft if method == "draft" else None)


@pytest.fixture(scope="module")
def alone(pairs):
    """Each prompt's greedy tokens from the target alone (one engine per pair and mode, each prompt
    on its own), computed once per module: every k and method compares with the same reference."""
    engines: dict[tuple[str, str], Engine] = {}
    done: dict[tuple[str, str, str], list[int]] = {}

    def tokens(arch: str, quantize: str, prompts: list[str]) -> list[list[int]]:
        if (arch, quantize) not in engines:
            engines[arch, quantize] = engine(pairs[arch], "none", quantize=quantize)
        for p in prompts:
            if (arch, quantize, p) not in done:
                done[arch, quantize, p] = engines[arch, quantize].generate([p], GREEDY)[0].token_ids
        return [done[arch, quantize, p] for p in prompts]

    return tokens


@pytest.mark.parametrize("quantize", MODES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_greedy_equals_target_only(pairs, alone, arch, k, quantize):
    pair = pairs[arch]
    expected = alone(arch, quantize, PROMPTS)
    spec = engine(pair, "draft", k, quantize=quantize)
    single = [spec.generate([p], GREEDY)[0].token_ids for p in PROMPTS[:2]]
    assert single == expected[:2]
    batched = run_staggered(spec, PROMPTS, GREEDY)
    assert batched == expected
    m = spec.metrics
    # The tiny draft is the target minus a layer: it must be right sometimes and wrong sometimes,
    # otherwise this test would not exercise rollback.
    assert 0 < m.total_accepted_tokens < m.total_draft_tokens
    assert spec.scheduler.kv_usage == 0.0


@pytest.mark.parametrize("quantize", MODES)
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_lookup_greedy_equals_target_only(pairs, alone, method, k, quantize):
    pair = pairs["llama"]
    prompts = PROMPTS + ["a b c d a b c d a b c d a b"]
    expected = alone("llama", quantize, prompts)
    spec = engine(pair, method, k, quantize=quantize)
    assert run_staggered(spec, prompts, GREEDY, every=1) == expected
    first = spec.metrics.accepted_tokens_by_source.get(method, 0)
    # Suffix: the second round also finds the first round's outputs in the global trie.
    assert [c.token_ids for c in spec.generate(prompts, GREEDY)] == expected
    assert spec.metrics.total_draft_tokens > 0
    if method == "suffix":
        second = spec.metrics.accepted_tokens_by_source["suffix"] - first
        assert second > first and len(spec.suffix.cache) == 2 * len(prompts)  # type: ignore[union-attr]


def test_suffix_proposals_from_other_requests_keep_greedy_output(pairs):
    """A prompt with nothing to copy from itself: only the global trie (an earlier request's
    output) can propose, and greedy output stays the target's."""
    pair = pairs["llama"]
    prompt = [5, 9, 14, 3]  # no token repeats
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    alone = engine(pair, "none").generate([prompt], params)[0].token_ids
    spec = engine(pair, "suffix", 4, suffix_cache_tokens=4096)
    assert spec.generate([prompt], params)[0].token_ids == alone
    own_only = spec.metrics.accepted_tokens_by_source.get("suffix", 0)
    again = spec.generate([prompt], params)[0]
    assert again.token_ids == alone
    # All but the first token of the repeat follow the earlier output's continuation.
    assert spec.metrics.accepted_tokens_by_source["suffix"] - own_only >= len(alone) // 2
    assert again.stats.verify_steps < len(alone) // 2


def test_request_joining_mid_flight_matches_alone(pairs):
    pair = pairs["llama"]
    eng = engine(pair, "draft", 3, max_num_seqs=4)
    alone = eng.generate([PROMPTS[1]], GREEDY)[0].token_ids
    first = eng.make_request(PROMPTS[0], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    eng.add_request(first)
    for _ in range(3):
        eng.step()
    joiner = eng.make_request(PROMPTS[1], GREEDY)
    eng.add_request(joiner)
    while eng.has_unfinished():
        eng.step()
    assert joiner.output_ids == alone


def test_chunked_prefill_and_mixed_k_per_request(pairs):
    """A long prompt prefilled in chunks next to running streams; per-request k overrides."""
    pair = pairs["llama"]
    long_prompt = " ".join(f"word{i}" for i in range(300))
    prompts = [PROMPTS[0], long_prompt, PROMPTS[2]]
    alone = engine(pair, "none").generate(prompts, GREEDY)
    eng = engine(pair, "draft", 4, prefill_chunk_size=64)
    params = [GREEDY, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, num_speculative_tokens=0),
              SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, num_speculative_tokens=2)]
    out = eng.generate(prompts, params)
    assert [c.token_ids for c in out] == [c.token_ids for c in alone]
    assert out[1].stats.draft_tokens == 0
    assert 0 < out[2].stats.draft_tokens <= 2 * out[2].stats.verify_steps


def test_adaptive_speculation_stays_exact(pairs):
    pair = pairs["qwen2"]
    alone = engine(pair, "none").generate(PROMPTS, GREEDY)
    target, draft = pair
    eng = Engine.from_loaded(EngineConfig(speculative_method="draft", num_speculative_tokens=5, quantize="int8"), target,
                             draft)  # adaptive (the default), in the reference's mode
    assert [c.token_ids for c in eng.generate(PROMPTS, GREEDY)] == [c.token_ids for c in alone]


@pytest.fixture(scope="module")
def smol(smol_gguf):
    return load(smol_gguf)


def smol_prompts(tok) -> list[str]:
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    ]
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return prompts + ["def is_prime(n):\n    "]


@pytest.mark.slow
def test_real_model_speculation_equals_decoding_alone(smol, quantize="gguf"):
    """SmolLM2-135M in the CPU default (gguf: Q8_0 blocks made at load): draft-model and n-gram
    speculation, several requests batched together, give exactly the tokens of decoding alone in
    the same mode. (Opt-in per-row int8 is held to the same on the tiny models above.)"""
    from specdec_core.loading.loader import LoadedModel

    n = smol.model.config.num_hidden_layers
    kept = (n // 2 - 1, n // 2)
    draft = LoadedModel(drop_layers(smol.model, [i for i in range(n) if i not in kept]), smol.tokenizer, "smol-draft", smol.path)
    prompts = smol_prompts(smol.tokenizer)
    params = SamplingParams(max_tokens=32, temperature=0.0)
    off = [engine((smol, None), "none", quantize=quantize).generate([p], params)[0].token_ids for p in prompts]
    for method in ("draft", "ngram"):
        spec = engine((smol, draft), method, 4, quantize=quantize)
        assert [c.token_ids for c in spec.generate(prompts, params)] == off
        assert spec.metrics.total_accepted_tokens > 0


@pytest.mark.slow
def test_real_model_matches_transformers_generate(smol):
    """SmolLM2-135M (real weights), fp32 native path: speculative greedy == transformers
    generate(do_sample=False)."""
    from specdec_core.loading.loader import LoadedModel

    n = smol.model.config.num_hidden_layers
    kept = (n // 2 - 1, n // 2)
    draft = LoadedModel(drop_layers(smol.model, [i for i in range(n) if i not in kept]), smol.tokenizer, "smol-draft", smol.path)
    tok = smol.tokenizer
    prompts = smol_prompts(tok)
    params = SamplingParams(max_tokens=32, temperature=0.0)
    eng = engine((smol, draft), "draft", 4, quantize="none")
    out = eng.generate(prompts, params)
    for prompt, got in zip(prompts, out):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = smol.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
        assert got.token_ids == ref[0, ids.shape[1]:].tolist()
    assert eng.metrics.total_accepted_tokens > 0
    assert "Paris" in out[0].text
