"""Token trees (issue 23): several continuations verified in one target forward.

- the forward: every node's logits are bit-identical (``torch.equal``) to decoding its path alone,
  whatever else is batched with it and wherever its blocks are; a chain given as a tree is the chain;
- the suffix trie's trees: best-first by path probability, preorder with the greedy chain first;
- verification: greedy keeps the longest path the target agrees with; sampled, the recursive
  rejection over siblings keeps the target's distribution (chi-square, with a negative control),
  and on a chain it is the linear rule, draw for draw;
- the engine: greedy output with trees equals speculation off, and trees are proposed, verified and
  accepted off the main chain.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

import specdec_core.speculation.tree_verifier as tree_verifier
from specdec_core import Engine, EngineConfig, SamplingParams
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.model_runner import ModelRunner
from specdec_core.speculation.draft_tree import DraftTree
from specdec_core.speculation.suffix_trie import SuffixTrie
from specdec_core.speculation.tree_verifier import verify_tree, verify_tree_greedy
from specdec_core.speculation.verifier import verify, verify_greedy
from tests.helpers.models import load
from tests.helpers.random_tries import random_trie
from tests.helpers.runners import region, slot_runner

MAX_LEN = 128
TREE = DraftTree([5, 9, 7, 3, 11, 2, 8], [-1, 0, 1, 0, -1, 4, 1])  # branches at the root and at node 1


@pytest.fixture(scope="module")
def models(tiny_model_factory):
    return {arch: load(tiny_model_factory(arch, num_layers=2, hidden=64, seed=21)) for arch in ("llama", "qwen2")}


def runner(loaded, quantize: str) -> ModelRunner:
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    return slot_runner(loaded.model, 6, MAX_LEN, vocab_size=vocab, quantize=quantize)


def decode_alone(run: ModelRunner, blocks: list[int], prompt: list[int], path: list[int]) -> torch.Tensor:
    """The logits after ``prompt`` and after each token of ``path``: the prompt but its last token
    prefilled, then one plain decode step per token."""
    run.forward([ForwardItem(blocks, 0, prompt[:-1], 0)])
    follow = prompt[-1:] + path
    return torch.cat([run.forward([ForwardItem(blocks, len(prompt) - 1 + i, [t], 1)]) for i, t in enumerate(follow)])


@pytest.mark.parametrize("quantize", ["none", "int8", "gguf"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_node_scores_what_decoding_its_path_alone_scores(models, arch, quantize):
    run = runner(models[arch], quantize)
    assert run.supports_trees
    rng = random.Random(3)
    prompt = [rng.randrange(200) for _ in range(37)]
    run.forward([ForwardItem(region(0, MAX_LEN), 0, prompt[:-1], 0)])
    # the tree's request in a scattered block table (its keys are gathered), beside other work
    scattered = [region(1, MAX_LEN)[0], region(3, MAX_LEN)[1], region(2, MAX_LEN)[2], region(1, MAX_LEN)[3]]
    run.forward([ForwardItem(scattered, 0, prompt[:-1], 0)])
    for blocks in (region(0, MAX_LEN), scattered):
        beside = ForwardItem(region(4, MAX_LEN), 0, [rng.randrange(200) for _ in range(9)], 3, num_drafts=2)
        tree = ForwardItem(blocks, len(prompt) - 1, [prompt[-1]] + TREE.tokens, 1 + len(TREE), num_drafts=len(TREE),
                           draft_paths=TREE.paths())
        logits = run.forward([beside, tree])[3:]
        for j in range(len(TREE)):
            path = [TREE.tokens[a] for a in TREE.paths()[j]]
            ref = decode_alone(run, region(5, MAX_LEN), prompt, path)
            assert torch.equal(logits[0], ref[0])
            assert torch.equal(logits[1 + j], ref[-1]), f"node {j} of the tree in {blocks[:4]}"


def test_a_chain_given_as_a_tree_is_the_chain(models):
    run = runner(models["qwen2"], "gguf")
    prompt = list(range(40, 70))
    run.forward([ForwardItem(region(0, MAX_LEN), 0, prompt[:-1], 0)])
    drafts = [4, 8, 15, 16]
    chain = run.forward([ForwardItem(region(0, MAX_LEN), len(prompt) - 1, [prompt[-1]] + drafts, 5, num_drafts=4)])
    as_tree = run.forward([ForwardItem(region(0, MAX_LEN), len(prompt) - 1, [prompt[-1]] + drafts, 5, num_drafts=4,
                                       draft_paths=[[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]])])
    assert torch.equal(chain, as_tree)


def test_paths_that_mask_by_position_refuse_trees(models):
    vocab = models["llama"].model.get_output_embeddings().weight.shape[0]
    packed = slot_runner(models["llama"].model, 2, MAX_LEN, vocab_size=vocab, attention="packed")
    assert not packed.supports_trees
    with pytest.raises(ValueError, match="token trees"):
        packed.forward([ForwardItem(region(0, MAX_LEN), 0, [1, 2, 3], 3, num_drafts=2, draft_paths=[[0], [1]])])


# ---------------------------------------------------------------- the suffix trie's trees


def candidates(trie: SuffixTrie, context: list[int], max_match: int, min_prob: float, limit: int):
    """Every node a tree may take below the longest match, with its path probability: the
    definition ``propose_tree`` must pick the likeliest of."""
    m, node = trie.longest_match(context, max_match)
    out: dict[tuple[int, ...], float] = {}
    stack = [((), node, 1.0)]
    while stack:
        path, n, prob = stack.pop()
        if len(path) >= limit or n is None or not trie.children(n):
            continue
        for t, child in trie.children(n).items():
            if trie.count(child) / trie.count(n) >= min_prob:
                out[path + (t,)] = prob * trie.count(child) / trie.count(n)
                stack.append((path + (t,), child, out[path + (t,)]))
    return m, out


def test_trees_take_the_likeliest_nodes_in_preorder_with_the_greedy_chain_first():
    rng = random.Random(5)
    for case in range(300):
        trie, context = random_trie(rng)
        k = rng.randint(1, 10)
        proposal = trie.propose_tree(context, k, 3, 0.1, 1.5)
        tree, m, score = DraftTree(proposal.tokens, proposal.parents), proposal.match_len, proposal.score
        chain = trie.propose(context, k, 3, 0.1, 1.5)
        m_ref, cands = candidates(trie, context, 3, 0.1, math.ceil(1.5 * m))
        assert m == m_ref == chain.match_len
        paths = [tuple(tree.tokens[a] for a in path) for path in tree.paths()]
        assert len(set(paths)) == len(paths) and set(paths) <= set(cands)
        assert len(tree) == min(k, len(cands)), case
        # best first: no node left out is likelier than a node taken
        if len(tree) < len(cands):
            assert min(cands[p] for p in paths) >= max(v for p, v in cands.items() if p not in paths) - 1e-12
        assert score == pytest.approx(sum(cands[p] for p in paths))
        # each node's count ratio, renumbered with it: the ratios along its path make its probability
        for path, p in zip(tree.paths(), paths, strict=True):
            assert math.prod(proposal.ratios[a][0] for a in path) == pytest.approx(cands[p])
        # the first nodes are the chain ``propose`` gives, as far as the tree's budget kept it
        assert tree.tokens[:tree.chain_length] == chain.tokens[:tree.chain_length]
        assert tree.chain_length == len(chain.tokens) or tree.chain_length < len(tree) or len(tree) == k


# ---------------------------------------------------------------- verification


def test_on_a_chain_the_tree_rule_is_the_linear_rule_draw_for_draw():
    gen = torch.Generator().manual_seed(0)
    bsz, k, vocab = 64, 5, 7
    p = torch.softmax(3 * torch.randn(bsz, k + 1, vocab, generator=gen), dim=-1)
    drafts = torch.randint(vocab, (bsz, k), generator=gen)
    num = torch.randint(k + 1, (bsz,), generator=gen)
    u = torch.rand(bsz, k + 1, generator=gen)
    parents = torch.arange(-1, k - 1).expand(bsz, k)
    q = torch.zeros(bsz, k, vocab).scatter_(2, drafts[:, :, None], 1.0)
    linear = verify(p, q, drafts, num, u[:, :k], u.gather(1, num[:, None]).squeeze(1))
    tree = verify_tree(p, drafts, parents, num, u[:, :k], u.gather(1, num[:, None]).squeeze(1))
    assert torch.equal(tree.accepted, linear.num_accepted) and torch.equal(tree.final, linear.final_token)
    assert all(tree.path[b, :n].tolist() == list(range(n)) for b, n in enumerate(tree.accepted.tolist()))
    greedy = verify_tree_greedy(p.argmax(-1), drafts, parents, num)
    ref = verify_greedy(p.argmax(-1), drafts, num)
    assert torch.equal(greedy.accepted, ref.num_accepted) and torch.equal(greedy.final, ref.final_token)


def test_greedy_keeps_the_longest_path_the_target_agrees_with():
    #   root -> 5 (0) -> 9 (1) -> 7 (2)
    #                 -> 3 (3)
    #        -> 11 (4) -> 2 (5);  node 6: 8 after node 1
    argmax = torch.tensor([[11, 9, 3, 1, 0, 2, 4, 6]])  # rows: root, then nodes 0..6
    result = verify_tree_greedy(argmax, torch.tensor([TREE.tokens]), torch.tensor([TREE.parents]), torch.tensor([7]))
    assert result.accepted.item() == 2 and result.path[0, :2].tolist() == [4, 5] and result.final.item() == 4  # row of node 5
    argmax = torch.tensor([[5, 3, 8, 1, 0, 2, 4, 6]])  # 5, then 3 (node 3, the second child of node 0)
    result = verify_tree_greedy(argmax, torch.tensor([TREE.tokens]), torch.tensor([TREE.parents]), torch.tensor([7]))
    assert result.accepted.item() == 2 and result.path[0, :2].tolist() == [0, 3] and result.final.item() == 0  # row of node 3


def tree_draws(p: torch.Tensor, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first emitted token of ``samples`` verify passes of ``TREE`` under row distributions
    ``p`` ``[8, V]``, and the second one of the passes that accepted node 0."""
    gen = torch.Generator().manual_seed(seed)
    k = len(TREE)
    u = torch.rand(samples, k + 1, generator=gen)
    drafts = torch.tensor([TREE.tokens]).expand(samples, k)
    result = verify_tree(p.expand(samples, *p.shape), drafts, torch.tensor([TREE.parents]).expand(samples, k),
                         torch.full((samples,), k), u[:, :k], u[:, k])
    emitted = torch.cat([drafts.gather(1, result.path.clamp(max=k - 1)), result.final[:, None]], dim=1)
    emitted.scatter_(1, result.accepted[:, None], result.final[:, None])
    first = emitted[:, 0]
    via_node0 = (result.accepted >= 1) & (result.path[:, 0] == 0)
    return first, emitted[via_node0, 1]


def test_sampled_trees_keep_the_target_distribution_and_the_test_would_see_a_bias(monkeypatch):
    """Chi-square of the first token against the root row and of the token after node 0 against
    node 0's row (which branches: the recursion), 40,000 passes; then the same test against a rule
    that forgets to renormalise after a rejected sibling."""
    from scipy.stats import chisquare

    vocab = 16
    gen = torch.Generator().manual_seed(7)
    p = torch.softmax(1.5 * torch.randn(len(TREE) + 1, vocab, generator=gen), dim=-1)
    p[0, 5], p[0, 11], p[1, 9], p[1, 3] = 2.0, 1.0, 2.0, 1.5  # the tree's tokens likely, not certain
    p = p / p.sum(dim=-1, keepdim=True)

    def p_values() -> tuple[float, float]:
        first, second = tree_draws(p, 40_000, seed=0)
        return tuple(float(chisquare(torch.bincount(x, minlength=vocab).double().numpy(),
                                     (row.double() / row.double().sum() * len(x)).numpy()).pvalue)
                     for x, row in ((first, p[0]), (second, p[1])))

    assert min(p_values()) > 1e-3
    monkeypatch.setattr(tree_verifier, "_accept", lambda u, px, removed: (u < px) & (px > 0))
    assert min(p_values()) < 1e-3


# ---------------------------------------------------------------- the engine


def planted_engine(loaded, reference: list[int], **kw) -> Engine:
    """A suffix engine whose global trie has seen ``reference`` and copies of a few of its stretches
    with one token changed to a lower id: there the trie branches evenly, the wrong token first (a
    tie goes to the lower id), so the target's continuation is the tree's second branch."""
    cfg = EngineConfig(speculative_method="suffix", num_speculative_tokens=8, adaptive_speculation=False, seed=0,
                       quantize="int8", suffix_cache_tokens=4096, **kw)
    eng = Engine.from_loaded(cfg, loaded)
    assert eng.suffix is not None
    eng.suffix.cache.add(reference)
    for c in (10, 32):  # each copy holds the 20 tokens before its change: the 12 a match uses, from 8 before
        eng.suffix.cache.add(reference[max(c - 20, 0):c] + [reference[c] - 1] + reference[c + 1:c + 8])
    return eng


def test_greedy_output_with_trees_is_the_targets_and_branches_are_accepted(models, monkeypatch):
    loaded = models["llama"]
    prompt = [5, 9, 14, 3, 77, 41]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    off = Engine.from_loaded(EngineConfig(speculative_method="none", seed=0, quantize="int8"), loaded)
    reference = off.generate([prompt], params)[0].token_ids
    eng = planted_engine(loaded, reference)
    assert eng.generate([prompt], params)[0].token_ids == reference
    m = eng.metrics
    assert m.tree_passes > 0 and m.tree_branch_tokens >= 3, (m.tree_passes, m.tree_branch_tokens)
    # the trees' accepted branches had their keys moved into place: without the move, the text breaks
    chains = planted_engine(loaded, reference, suffix_trees=False)
    assert chains.generate([prompt], params)[0].token_ids == reference and chains.metrics.tree_passes == 0
    broken = planted_engine(loaded, reference)
    monkeypatch.setattr(broken.target.cache, "copy_rows", lambda src, dst: None)
    assert broken.generate([prompt], params)[0].token_ids != reference
