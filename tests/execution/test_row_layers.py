"""The decoder stack as one C call (``execution/row_layers.py``, ``csrc/decode_rows.c``) computes
what the per-op layers of ``native_decoder`` compute, bit for bit (``torch.equal``): logits and
every key and value written to the cache, on tiny random models of every native family in the
CPU default (``--quantize gguf``), over prompts fed row by row, decode rows, drafts, and
batches of all three. And it is the path the CPU default takes."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_core.execution.forward_plan import ForwardItem
from tests.helpers.models import load
from tests.helpers.runners import MAX_LEN, NUM_DRAFTS, PROMPT_LEN, others, region, slot_runner

# the shapes of test_batch_invariance: Gemma 3's sliding window (8) is shorter than the prompts, Phi-3
# rotates part of each head, Qwen2 has q/k/v biases, Qwen3 and Gemma 3 norm each query and key head
FAMILIES = {"llama": (2, 11), "qwen2": (2, 12), "qwen3": (2, 13), "gemma3": (3, 14), "phi3": (2, 15)}


def _runner(loaded, quantize: str = "gguf"):
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    return slot_runner(loaded.model, 17, MAX_LEN, vocab_size=vocab, quantize=quantize)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_one_call_stack_equals_the_per_op_layers(tiny_model_factory, arch):
    layers, seed = FAMILIES[arch]
    loaded = load(tiny_model_factory(arch, num_layers=layers, hidden=64, seed=seed))
    one_call, per_op = _runner(loaded), _runner(loaded)
    assert one_call.native.row_layers is not None
    per_op.native.row_layers = None
    vocab = one_call.vocab_size
    rng = random.Random(arch)
    prompt = [rng.randrange(vocab) for _ in range(PROMPT_LEN)]
    follow = [rng.randrange(vocab) for _ in range(NUM_DRAFTS + 1)]
    forwards = [
        [ForwardItem(region(0, MAX_LEN), 0, prompt, 1)],
        [ForwardItem(region(0, MAX_LEN), PROMPT_LEN, follow, NUM_DRAFTS + 1, NUM_DRAFTS)],
        [ForwardItem(region(0, MAX_LEN), PROMPT_LEN + NUM_DRAFTS + 1, follow[:1], 1)],
        others(rng, vocab, 6, list(range(1, 17))),
        others(rng, vocab, 9, list(range(7, 17))),
    ]
    for i, items in enumerate(forwards):
        assert torch.equal(one_call.forward(items), per_op.forward(items)), f"forward {i} differs"
    for layer, (k1, v1, k2, v2) in enumerate(zip(one_call.cache.keys, one_call.cache.values,
                                                 per_op.cache.keys, per_op.cache.values)):
        assert torch.equal(k1, k2) and torch.equal(v1, v2), f"the cache of layer {layer} differs"


@pytest.mark.parametrize("quantize,per_op_calls", [("gguf", 0), ("int8", 2)])
def test_the_cpu_default_runs_the_one_call_stack(tiny_model_factory, quantize, per_op_calls):
    """In the CPU default no forward goes through the per-op layers (their hook never fires);
    with torch's linears (int8) there is no C stack and the per-op layers run."""
    loaded = load(tiny_model_factory("llama", num_layers=2, hidden=64, seed=11))
    run = _runner(loaded, quantize)
    assert (run.native.row_layers is None) == (quantize != "gguf")
    calls = []
    run.native.layers[0].register_forward_pre_hook(lambda module, args: calls.append(1))
    run.forward([ForwardItem(region(0, MAX_LEN), 0, list(range(5, 5 + PROMPT_LEN)), 1)])
    run.forward([ForwardItem(region(0, MAX_LEN), PROMPT_LEN, [7, 8, 9], 3, 2)])
    assert len(calls) == per_op_calls
