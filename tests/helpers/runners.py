"""``ModelRunner``s driven by hand, without a scheduler: a pool of fixed regions addressed by
slot, and the pieces of the batch-invariance check (a request alone, unrelated work to batch
beside it) that the execution tests share."""

from __future__ import annotations

import random

import torch

from specdec_core.execution import kv_cache
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.model_runner import ModelRunner

TEST_BLOCK = 16  # KV block size of the runners built in tests


def slot_runner(model: torch.nn.Module, num_slots: int, max_len: int, vocab_size: int, quantize: str = "none",
                attention: str = "auto", graph_buckets: tuple[int, int] | None = None, **kwargs) -> ModelRunner:
    """A ``ModelRunner`` whose KV pool holds ``num_slots`` regions of ``max_len`` positions, the
    tables ``region(i, max_len)`` gives: tests that place requests by hand address them so. Its
    profile is the model's device and dtype with ``quantize`` and ``attention``, and decode graphs
    (bucketed shapes) where ``graph_buckets`` is given."""
    profile = DeviceProfile.of_model(model, quantize, attention, "on" if graph_buckets else "off")
    return ModelRunner(model, num_blocks=num_slots * kv_cache.blocks_for(max_len, TEST_BLOCK), block_size=TEST_BLOCK,
                       max_len=max_len, vocab_size=vocab_size, profile=profile, graph_buckets=graph_buckets, **kwargs)


def region(i: int, max_len: int) -> list[int]:
    """The block table of region ``i`` of a ``slot_runner``'s pool: consecutive blocks."""
    return kv_cache.region(i, max_len, TEST_BLOCK)


# -- the batch-invariance check (tests/execution/test_batch_invariance.py, test_gguf_runner.py) ------------

MAX_LEN = 160
PROMPT_LEN = 37
NUM_DRAFTS = 4


def alone(run: ModelRunner, prompt: list[int], follow: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill ``prompt`` alone, then decode ``follow`` one token per step: the reference logits."""
    first = run.forward([ForwardItem(region(0, MAX_LEN), 0, prompt, 1)])
    steps = [run.forward([ForwardItem(region(0, MAX_LEN), len(prompt) + i, [t], 1)]) for i, t in enumerate(follow)]
    return first, torch.cat(steps)


def others(rng: random.Random, vocab: int, count: int, slots: list[int]) -> list[ForwardItem]:
    """Unrelated work to batch beside the request: decode rows with drafts and prompt chunks."""
    items = []
    for slot in slots[:count]:
        kind = rng.choice(["decode", "drafts", "chunk"])
        start = 0 if kind == "chunk" else rng.randrange(1, MAX_LEN - 40)
        n = rng.randint(2, 33) if kind == "chunk" else 1 + (rng.randint(1, 6) if kind == "drafts" else 0)
        tokens = [rng.randrange(vocab) for _ in range(n)]
        drafts = n - 1 if kind == "drafts" else 0
        items.append(ForwardItem(region(slot, MAX_LEN), start, tokens, rng.choice([0, 1, n]) if kind == "chunk" else n, drafts))
    return items
