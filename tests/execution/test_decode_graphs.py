"""The graph-ready decode path (``execution/decode_graphs.py``): forwards padded to static buckets
give every real row bit for bit what the eager packed forward gives, padding writes only the
scratch block, and the engine's output is the same token for token with it on and off.

On CUDA these buckets are captured as graphs and replayed; here (no GPU) they run eagerly, which
is the same arithmetic on the same shapes: what a graph would replay is what is checked.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec_core.execution.decode_graphs import Bucket, batch_buckets, kv_bucket
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.host_upload import HostUpload
from tests.helpers.models import load
from tests.helpers.runners import region, slot_runner

MAX_LEN, K = 160, 4


def test_buckets() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 24]
    assert [kv_bucket(n, 16, 1000) for n in (1, 64, 65, 500, 999)] == [64, 64, 128, 512, 1008]
    assert kv_bucket(40, 16, 40) == 48  # capped at max_len rounded up to a block
    assert Bucket(4, 5, 128).index_length() == 5 * 20 + 4 * 128


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tiny_model_factory):
    return load(tiny_model_factory(request.param, num_layers=2, hidden=64, seed=3)).model


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_bucketed_forwards_equal_the_eager_packed_forward(model, quantize: str) -> None:
    """Prefill three requests eagerly, then decode and verify random subsets of them (groups
    padded 3 -> 4, 5 -> 8, tokens to groups x (1 + k), keys across a bucket boundary) in both
    runners: every logit equal, and the bucketed runner really ran padded shapes. A bucket pads
    each request's queries to 1 or 1 + K; a packed call's rows depend on that width (CPU SDPA),
    so every verifying forward here has one request with K drafts, as the eager call then has."""
    vocab = model.config.vocab_size
    eager = slot_runner(model, 6, MAX_LEN, vocab_size=vocab, quantize=quantize, attention="packed")
    padded = slot_runner(model, 6, MAX_LEN, vocab_size=vocab, quantize=quantize, attention="packed", graph_buckets=(6, K + 1))
    assert eager.graphs is None and padded.graphs is not None
    rng = random.Random(f"graphs-{quantize}")
    lengths = [rng.randrange(20, 60) for _ in range(5)]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    for runner in (eager, padded):
        out = runner.forward([ForwardItem(region(i, MAX_LEN), 0, p, 1) for i, p in enumerate(prompts)])
    buckets = set()
    for _ in range(24):
        batch = sorted(rng.sample(range(5), rng.choice([1, 2, 3, 5])))
        drafts = [rng.randrange(K + 1) for _ in batch]
        if any(drafts):  # a bucket gives every request 1 or 1 + K query slots: the eager call's shape
            drafts[rng.randrange(len(drafts))] = K
        items = []
        for i, k in zip(batch, drafts):
            items.append(ForwardItem(region(i, MAX_LEN), lengths[i], [rng.randrange(vocab) for _ in range(1 + k)],
                                     1 + k, num_drafts=k))
        a, b = eager.forward(items), padded.forward(items)
        assert torch.equal(a, b), f"batch {batch}: max diff {(a - b).abs().max()}"
        for i, it in zip(batch, items):  # accept some drafts: the next forward starts after them
            lengths[i] += 1 + rng.randrange(it.num_drafts + 1)
        plan = padded.plan(items, HostUpload())
        assert plan.bucketed and plan.packed_shape is not None
        buckets.add(plan.packed_shape)
    assert out.shape[0] == 5
    assert {b.groups for b in buckets} >= {1, 2, 4, 8} and max(lengths) > 64, (buckets, lengths)


def test_padding_writes_only_the_scratch_block(model) -> None:
    vocab = model.config.vocab_size
    runner = slot_runner(model, 4, MAX_LEN, vocab_size=vocab, attention="packed", graph_buckets=(8, K + 1))
    items = [ForwardItem(region(i, MAX_LEN), 0, [5 + i, 6, 7], 3, num_drafts=2) for i in range(3)]  # 3 -> 4 groups
    runner.forward(items)
    bs, scratch = runner.cache.block_size, runner.cache.scratch_row
    written = {b * bs + o for i in range(3) for b in region(i, MAX_LEN)[:1] for o in range(3)}
    for keys in runner.cache.keys:
        touched = set(keys.abs().sum(dim=(0, 2)).nonzero().flatten().tolist())
        assert touched - written <= set(range(scratch, scratch + bs)) and written <= touched


def test_prefill_chunks_and_oversized_batches_stay_eager(model) -> None:
    runner = slot_runner(model, 4, MAX_LEN, vocab_size=model.config.vocab_size, attention="packed", graph_buckets=(2, K + 1))
    assert runner.graphs is not None
    long = runner.plan([ForwardItem(region(0, MAX_LEN), 0, list(range(10)), 1)], HostUpload())
    crowd = runner.plan([ForwardItem(region(i, MAX_LEN), 4, [1], 1) for i in range(3)], HostUpload())
    fits = runner.plan([ForwardItem(region(i, MAX_LEN), 4, [1, 2], 2, 1) for i in range(2)], HostUpload())
    assert not long.bucketed and not crowd.bucketed and fits.bucketed


PROMPTS = ["def fibonacci(n):\n    if n < 2:\n", "The capital of France is", "1, 2, 3, 4, 5,",
           "Once upon a time, in a land far away,", "import numpy as np\n", "the the the the"]


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_engine_output_is_the_same_with_decode_graphs_on_and_off(tiny_target, tiny_draft, quantize: str) -> None:
    """Draft speculation (k=4) over staggered requests, greedy and seeded sampled: the same tokens
    with the bucketed forwards as with the eager packed ones (same schedule, bit-equal rows)."""
    from specdec_core import Engine, EngineConfig, SamplingParams
    from tests.helpers.engine_runs import run_staggered

    pair = (load(tiny_target), load(tiny_draft, role="draft"))
    outputs = {}
    for graphs in ("off", "on"):
        cfg = EngineConfig(speculative_method="draft", num_speculative_tokens=K, adaptive_speculation=False, seed=0,
                           quantize=quantize, attention="packed", decode_graphs=graphs, max_num_seqs=5)
        eng = Engine.from_loaded(cfg, *pair)
        assert (eng.target.graphs is not None) == (graphs == "on")
        greedy = run_staggered(eng, PROMPTS, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
        sampled = run_staggered(eng, PROMPTS, SamplingParams(max_tokens=20, temperature=0.9, seed=7, ignore_eos=True))
        outputs[graphs] = (greedy, sampled)
        if graphs == "on":
            assert eng.target.graphs is not None and eng.draft_runner is not None and eng.draft_runner.graphs is not None
            # verification (q = 1 + k) and draft positions (q = 1) ran padded, several batch sizes
            assert {b.q for b in eng.target.graphs.buckets_used} >= {K + 1}
            assert {b.q for b in eng.draft_runner.graphs.buckets_used} >= {1}
            assert len({b.groups for b in eng.target.graphs.buckets_used}) >= 2
    assert outputs["on"] == outputs["off"]


def test_decode_graphs_on_needs_packed_attention(tiny_target) -> None:
    from specdec_core import Engine, EngineConfig

    with pytest.raises(ValueError, match="packed attention"):
        Engine.from_loaded(EngineConfig(speculative_method="none", attention="segments", decode_graphs="on"),
                           load(tiny_target), None)
