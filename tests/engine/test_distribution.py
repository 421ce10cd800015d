"""Distribution exactness of speculative sampling, in every quantization mode.

A 16-token target and an unrelated draft: the exact target distribution of 2-token continuations
is enumerated (through the same batch-invariant runner the engine uses, so in int8 it is the int8
model's distribution), 10,000 speculative samples are drawn through the real engine (drafts for both
positions, so acceptance, residual resampling and the bonus token all take part), and a
chi-square test must pass. The same test shows it would catch a sampler that resamples a rejected
draft from p instead of the residual norm(max(0, p - q)).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

import specdec_core.speculation.tree_verifier as tree_verifier
import specdec_core.speculation.verifier as verifier_module
from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.decoding.sampling import RowParams, warp
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.gguf_linear import BlockWeight, GGUFLinear
from specdec_core.execution.gguf_weights import ATTRIBUTE
from tests.helpers.distribution import SAMPLES, VOCAB, biased_verify, build_small_vocab_model, chi_square_p
from tests.helpers.models import load
from tests.helpers.runners import region, slot_runner

PROMPT = [3, 7, 1]


@pytest.fixture(scope="module")
def tiny_vocab_pair(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok_dir = tmp_path_factory.mktemp("tok16")
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(tok_dir)
    target = load(build_small_vocab_model(tmp_path_factory.mktemp("t16"), 0, tok_dir))
    draft = load(build_small_vocab_model(tmp_path_factory.mktemp("d16"), 0, tok_dir, noise=0.5), role="draft")
    return target, draft


def exact_two_token_distribution(model, params: SamplingParams, quantize: str, prompt: list[int] = PROMPT) -> torch.Tensor:
    """P(t1, t2 | prompt) under the warped target, as a flat [VOCAB * VOCAB] tensor."""
    run = slot_runner(model, VOCAB + 1, 16, vocab_size=VOCAB, quantize=quantize)
    p1 = warp(run.forward([ForwardItem(region(VOCAB, 16), 0, prompt, 1)]), [RowParams(params)])[0]
    logits = run.forward([ForwardItem(region(t, 16), 0, prompt + [t], 1, num_drafts=1) for t in range(VOCAB)])
    p2 = warp(logits, [RowParams(params)] * VOCAB)
    return (p1[:, None] * p2).flatten().double()


def draw(target, draft, params: SamplingParams, quantize: str, method: str = "draft",
         prompt: list[int] = PROMPT, draft_vocab_size: int = 0, suffix_trees: bool = True) -> torch.Tensor:
    cfg = EngineConfig(speculative_method=method, num_speculative_tokens=2, adaptive_speculation=False,
                       draft_vocab_size=draft_vocab_size, suffix_trees=suffix_trees,
                       max_num_seqs=256, max_model_len=16, prefill_chunk_size=2048, seed=1234,
                       quantize=quantize)
    eng = Engine.from_loaded(cfg, target, draft)
    out = eng.generate([prompt] * SAMPLES, params)
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    for c in out:
        assert len(c.token_ids) == 2
        counts[c.token_ids[0] * VOCAB + c.token_ids[1]] += 1
    # Every request drafts both tokens on its first step; a meaningful share must be rejected,
    # and some must be fully accepted (bonus token), or the test would not cover every branch.
    m = eng.metrics
    if method == "suffix":
        # Every request's first step drafts two tokens from its own trie; later requests also
        # find earlier requests' outputs in the global trie, which wins some second steps.
        # (It holds as many 2-token outputs as its token budget allows: 8,192 of the 10,000.)
        assert eng.suffix is not None and len(eng.suffix.cache) == eng.config.suffix_cache_tokens // 2
        # With trees, every first step verifies the prompt's two continuations as one tree (its
        # drafts count as the one-token chain it amounts to); the second step drafts from the tries.
        assert m.tree_passes >= (SAMPLES if suffix_trees else 0) and (m.tree_passes > 0) == suffix_trees
        assert m.draft_tokens_by_source["suffix"] > (1 if suffix_trees else 2) * SAMPLES, m.draft_tokens_by_source
    if method == "auto":
        # A first token that occurs in the prompt makes the second step an n-gram lookup (one-hot q)
        # batched beside draft-model rows: both kinds of q go through one verification.
        assert m.draft_tokens_by_source.get("ngram", 0) > 0.05 * SAMPLES, m.draft_tokens_by_source
    depth = 1 if suffix_trees and method == "suffix" else 2  # a tree of two siblings is one deep
    assert m.total_draft_tokens >= depth * SAMPLES
    # (auto: lookups that mostly miss pull the overall rate down; their rejections are the point)
    # (a draft head over half the vocabulary misses often too)
    assert (0.05 if method in ("auto", "suffix") or draft_vocab_size else 0.2) < m.acceptance_rate < 0.9, \
        m.acceptance_rate
    assert m.accepted_histogram[0] > 0 and m.accepted_histogram[depth] > 0
    return counts


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True),
        SamplingParams(max_tokens=2, temperature=0.7, top_k=8, top_p=0.9, ignore_eos=True),
    ],
    ids=["t1.0", "t0.7-topk8-topp0.9"],
)
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_speculative_samples_match_target_distribution(tiny_vocab_pair, params, quantize, monkeypatch):
    target, draft = tiny_vocab_pair
    probs = exact_two_token_distribution(target.model, params, quantize)
    assert chi_square_p(draw(target, draft, params, quantize), probs) > 1e-3

    # Negative control: the same test rejects a sampler that is wrong after a rejection. Once per
    # warping is enough: the quantized modes run the same verification over nearly the same
    # distributions, so they would show the test's power again, not the sampler's exactness.
    if quantize == "none":
        monkeypatch.setattr(verifier_module, "verify", biased_verify)
        assert chi_square_p(draw(target, draft, params, quantize), probs) < 1e-3


def with_blocks(loaded, qtype: GGMLQuantizationType = GGMLQuantizationType.Q4_0):
    """A copy of ``loaded`` whose every linear carries GGUF blocks of its weights, the weights
    replaced by their dequantization (as a model converted from a GGUF file), for
    ``quantize="gguf"``; the blocks are attached again before each runner takes them."""
    model = copy.deepcopy(loaded.model)
    blocks = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            raw = quants.quantize(module.weight.detach().numpy(), qtype)
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(quants.dequantize(raw, qtype).astype(np.float32)))
            blocks[name] = BlockWeight(int(qtype), torch.from_numpy(raw), module.in_features)

    def attach() -> None:
        for name, weight in blocks.items():
            setattr(model.get_submodule(name), ATTRIBUTE, weight)

    return dataclasses.replace(loaded, model=model), attach


@pytest.mark.slow
def test_gguf_blocks_keep_the_target_distribution(tiny_vocab_pair):
    """``--quantize gguf`` (the CPU default for GGUF models): both models served from Q4_0
    blocks through the block kernels; speculative samples follow the block model's exact
    distribution (the negative control of the unquantized case covers this one's power)."""
    (target, attach_target), (draft, attach_draft) = (with_blocks(m) for m in tiny_vocab_pair)
    params = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)
    attach_target()
    served = slot_runner(target.model, 1, 16, vocab_size=VOCAB, quantize="gguf")
    assert sum(isinstance(m, GGUFLinear) for m in served.native.modules()) == 5  # qkv, o, gate/up, down, head
    attach_target()
    probs = exact_two_token_distribution(target.model, params, "gguf")

    def gguf_draw() -> torch.Tensor:
        attach_target()
        attach_draft()
        return draw(target, draft, params, "gguf")

    assert chi_square_p(gguf_draw(), probs) > 1e-3


@pytest.mark.slow
def test_auto_mixes_lookup_and_draft_rows_and_keeps_the_distribution(tiny_vocab_pair):
    target, draft = tiny_vocab_pair
    params = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)
    prompt = list(range(2, 12))  # distinct tokens: most first tokens recur in it, so lookups hit
    probs = exact_two_token_distribution(target.model, params, "int8", prompt)
    assert chi_square_p(draw(target, draft, params, "int8", method="auto", prompt=prompt), probs) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("trees", [False, True])
def test_suffix_lookups_keep_the_distribution_and_the_test_would_see_a_bias(tiny_vocab_pair, monkeypatch, trees):
    """One-hot q from the request's own trie and from other requests' outputs (the global trie):
    the same verification as n-gram, so the same exactness, with its negative control; with token
    trees, the recursive rejection over siblings, with its own (a rule that does not renormalise
    after a rejected sibling)."""
    target, draft = tiny_vocab_pair
    params = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)
    if trees:
        # "3 7" was followed by 14 and by 10: a tree of two children, 10 first (a tie: the lower
        # id). The target draws 14 about 0.42 of the time and 10 about 0.30 (both siblings matter).
        prompt = [3, 7, 14, 9, 3, 7, 10, 13, 3, 7]
        first = exact_two_token_distribution(target.model, params, "int8", prompt).view(VOCAB, VOCAB).sum(dim=1)
        assert first[14] > 0.3 and first[10] > 0.2
    else:
        prompt = [3, 7, 14, 13, 3, 7]  # "3 7" was followed by "14 13": two drafts on the first step
    probs = exact_two_token_distribution(target.model, params, "int8", prompt)
    # The target draws "14 13" about a third of the time: acceptance, rejection and bonus all occur.
    assert trees or 0.1 < probs[14 * VOCAB + 13] < 0.9
    assert chi_square_p(draw(target, draft, params, "int8", "suffix", prompt, suffix_trees=trees), probs) > 1e-3
    if trees:
        monkeypatch.setattr(tree_verifier, "_accept", lambda u, px, removed: (u < px) & (px > 0))
    else:
        monkeypatch.setattr(verifier_module, "verify", biased_verify)
    assert chi_square_p(draw(target, draft, params, "int8", "suffix", prompt, suffix_trees=trees), probs) < 1e-3


@pytest.mark.slow
def test_a_draft_head_over_part_of_the_vocabulary_keeps_the_distribution(tiny_vocab_pair):
    """FR-Spec: the draft scores only tokens 0..7 of 16; q is 0 elsewhere and still exact."""
    target, draft = tiny_vocab_pair
    params = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)
    probs = exact_two_token_distribution(target.model, params, "int8")
    counts = draw(target, draft, params, "int8", draft_vocab_size=8)
    assert counts.view(VOCAB, VOCAB)[:, 8:].sum() > 0  # the target still reaches the other half
    assert chi_square_p(counts, probs) > 1e-3
