"""The execution contract, checked bit for bit (``torch.equal``, no tolerance):

1. a request's logits do not depend on what else is in the forward: other requests, their
   lengths, their number of draft rows, prompt chunks beside it, the batch size (1..16);
2. verifying drafts gives exactly the logits that decoding the same tokens one step at a time
   gives, which is what makes greedy speculation token-identical to speculation off.

For every quantization mode, on tiny random models of every native family (Gemma 3's with
sliding-window layers shorter than the prompts, Phi-3's with partial rotary dims) and on
SmolLM2-135M.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.kv_cache import contiguous_base
from specdec_core.execution.linear_kernels import prepare_linear
from specdec_core.execution.model_runner import ModelRunner
from tests.helpers.models import load
from tests.helpers.runners import MAX_LEN, NUM_DRAFTS, PROMPT_LEN, TEST_BLOCK, alone, others, region, slot_runner

MODES = ["none", "int8", "gguf"]
FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "phi3"]


class Models(dict):
    """Models by name, loaded on first use (SmolLM2 only for the tests that ask for it)."""

    def __init__(self, factory, smol_gguf) -> None:
        super().__init__()
        self._sources = {
            "llama": lambda: factory("llama", num_layers=2, hidden=64, seed=11),
            "qwen2": lambda: factory("qwen2", num_layers=2, hidden=64, seed=12),
            "qwen3": lambda: factory("qwen3", num_layers=2, hidden=64, seed=13),
            "gemma3": lambda: factory("gemma3", num_layers=3, hidden=64, seed=14),
            "phi3": lambda: factory("phi3", num_layers=2, hidden=64, seed=15),
            "smollm2": lambda: smol_gguf,
        }

    def __missing__(self, name: str):
        self[name] = load(self._sources[name]())
        return self[name]


@pytest.fixture(scope="module")
def models(tiny_model_factory, smol_gguf):
    return Models(tiny_model_factory, smol_gguf)


def runner(loaded, quantize: str) -> ModelRunner:
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    return slot_runner(loaded.model, 17, MAX_LEN, vocab_size=vocab, quantize=quantize)


@pytest.mark.parametrize("quantize", MODES)
@pytest.mark.parametrize("arch", [*FAMILIES, pytest.param("smollm2", marks=pytest.mark.slow)])
def test_logits_independent_of_batch_and_equal_to_plain_decoding(models, arch, quantize):
    loaded = models[arch]
    run = runner(loaded, quantize)
    assert run.path == "native"
    vocab = run.vocab_size
    rng = random.Random(f"{arch}-{quantize}")
    prompt = [rng.randrange(vocab) for _ in range(PROMPT_LEN)]
    follow = [rng.randrange(vocab) for _ in range(NUM_DRAFTS + 1)]
    ref_first, ref_steps = alone(run, prompt, follow)

    # Verification of 1 known token + 4 drafts, alone: equal to 5 plain decode steps.
    run.forward([ForwardItem(region(1, MAX_LEN), 0, prompt, 1)])
    verify = run.forward([ForwardItem(region(1, MAX_LEN), PROMPT_LEN, follow, NUM_DRAFTS + 1, NUM_DRAFTS)])
    assert torch.equal(verify, ref_steps)

    for batch_size in (2, 4, 9, 16):
        slot = rng.randrange(2, 17)
        free = [s for s in range(2, 17) if s != slot] + [0, 1]
        before = others(rng, vocab, batch_size - 1, free)
        after = others(rng, vocab, batch_size - 1, free)
        at = rng.randrange(len(before) + 1)
        # The prompt chunk (+ its first logits) beside other work, then the verification beside other work.
        got = run.forward(before[:at] + [ForwardItem(region(slot, MAX_LEN), 0, prompt, 1)] + before[at:])
        offset = sum(it.num_logits for it in before[:at])
        assert torch.equal(got[offset:offset + 1], ref_first), f"prefill row differs at batch size {batch_size}"
        at = rng.randrange(len(after) + 1)
        got = run.forward(after[:at] + [ForwardItem(region(slot, MAX_LEN), PROMPT_LEN, follow, NUM_DRAFTS + 1, NUM_DRAFTS)] + after[at:])
        offset = sum(it.num_logits for it in after[:at])
        assert torch.equal(got[offset:offset + NUM_DRAFTS + 1], ref_steps), f"verify rows differ at batch size {batch_size}"


@pytest.mark.parametrize("arch", FAMILIES)
def test_native_fp32_matches_transformers_forward(models, arch):
    """The native path computes what the transformers model computes (fp32, same tokens; 29 of
    them: past Gemma's window of 8, below Phi's LongRoPE switch at 64)."""
    loaded = models[arch]
    run = runner(loaded, "none")
    ids = torch.randint(0, run.vocab_size, (1, 29), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = loaded.model(ids).logits[0].float()
    got = run.forward([ForwardItem(region(3, MAX_LEN), 0, ids[0].tolist(), 29)])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sign", [1.0, -1.0, 0.0])
def test_int8_kernel_computes_exactly_the_quantized_product(sign):
    """The int8 GEMM is exact integer arithmetic: what the quantized activations times the
    quantized weights give, even at full range. On a CPU without VNNI, fbgemm adds pairs of
    uint8 x int8 products in saturating int16; with 8-bit weights this input (every activation
    at the top of its range, every weight at the top of its range, same signs) came out wrong."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.ones(48, 256) if sign else torch.randn(48, 256, generator=gen)
    weight = weight * (sign or 1.0)
    rows = torch.cat([torch.ones(2, 256), -torch.ones(1, 256), torch.randn(5, 256, generator=gen) * 3])
    layer = prepare_linear(weight, None, "int8")
    got = layer(rows).double()
    qweight = torch.ops.quantized.linear_unpack(layer.packed)[0].dequantize().double()
    scale = rows.abs().amax(dim=1, keepdim=True).double()
    qrows = torch.round(rows.double() / scale * 127).clamp(-127, 127)
    want = (qrows @ qweight.T) * scale / 127
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_int8_rows_are_close_to_fp32(models):
    """Per-row int8 stays close to the fp32 model on real weights (the quality trade-off)."""
    loaded = models["smollm2"]
    ids = loaded.tokenizer("def fibonacci(n):\n    if n < 2:\n        return n\n    return", return_tensors="pt").input_ids[0].tolist()
    fp32 = runner(loaded, "none").forward([ForwardItem(region(0, MAX_LEN), 0, ids, len(ids))])
    int8 = runner(loaded, "int8").forward([ForwardItem(region(0, MAX_LEN), 0, ids, len(ids))])
    agree = (fp32.argmax(-1) == int8.argmax(-1)).float().mean().item()
    assert agree >= 0.8, f"int8 top-1 agrees with fp32 on only {agree:.0%} of positions"


@pytest.mark.slow
def test_negative_control_drafts_attended_as_one_block_differ(models):
    """The check above can fail: attending the drafts together with the known token (one causal
    block through torch's SDPA, as a packed mask does, and as prompt blocks were attended before
    every row got its own call) changes their logits in the last bits on real weights."""
    run = runner(models["smollm2"], "none")
    rng = random.Random(5)
    prompt = [rng.randrange(run.vocab_size) for _ in range(PROMPT_LEN)]
    follow = [rng.randrange(run.vocab_size) for _ in range(NUM_DRAFTS + 1)]
    _, ref_steps = alone(run, prompt, follow)
    assert run.rows_alone
    run.row_attention = False  # every known block one SDPA call
    run.forward([ForwardItem(region(1, MAX_LEN), 0, prompt, 1)])
    block = run.forward([ForwardItem(region(1, MAX_LEN), PROMPT_LEN, follow, NUM_DRAFTS + 1, num_drafts=0)])
    assert not torch.equal(block, ref_steps)


def test_dense_kernel_path_in_bfloat16(tiny_model_factory):
    """The kernel CUDA uses (plain ``F.linear`` in the model's dtype), exercised on the CPU in bf16:
    no GPU is lent to CI, so this is what keeps the bf16 native path from rotting."""
    loaded = load(tiny_model_factory("qwen2", num_layers=2, hidden=64, seed=12))
    model = loaded.model.to(torch.bfloat16)  # a fresh copy: load() is not memoised
    run = runner(loaded, "none")
    assert run.path == "native" and run.native.lm_head.kernel == "dense"
    ids = torch.randint(0, run.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids).logits[0].float()
    got = run.forward([ForwardItem(region(1, MAX_LEN), 0, ids[0].tolist(), 12)])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.1)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_packed_attention_computes_what_the_segments_compute(models, arch):
    """The one-call-per-layer layout CUDA runs, on the CPU: every row of a mixed batch (prompt
    chunks, decode rows, rows with drafts) equals the segmented layout up to fp32 rounding, and
    a verified draft equals plain decoding of the same token up to rounding."""
    loaded = models[arch]
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    seg = runner(loaded, "none")
    packed = slot_runner(loaded.model, 17, MAX_LEN, vocab_size=vocab, attention="packed")
    assert packed.attention == "packed" and seg.attention == "segments"
    rng = random.Random(f"packed-{arch}")
    prefill = [ForwardItem(region(s, MAX_LEN), 0, [rng.randrange(vocab) for _ in range(60)], 1) for s in range(8)]
    for run in (seg, packed):
        run.forward(prefill)
    batch = others(rng, vocab, 8, list(range(8, 16))) + [
        ForwardItem(region(s, MAX_LEN), 60, [rng.randrange(vocab) for _ in range(1 + s % 5)], 1 + s % 5, s % 5) for s in range(8)]
    torch.testing.assert_close(packed.forward(batch), seg.forward(batch), rtol=1e-4, atol=1e-4)
    prompt = [rng.randrange(vocab) for _ in range(PROMPT_LEN)]
    follow = [rng.randrange(vocab) for _ in range(NUM_DRAFTS + 1)]
    _, ref_steps = alone(seg, prompt, follow)
    packed.forward([ForwardItem(region(16, MAX_LEN), 0, prompt, 1)])
    verify = packed.forward([ForwardItem(region(16, MAX_LEN), PROMPT_LEN, follow, NUM_DRAFTS + 1, NUM_DRAFTS)])
    torch.testing.assert_close(verify, ref_steps, rtol=1e-4, atol=1e-4)


def test_transformers_path_computes_what_the_model_computes() -> None:
    """The generic path (a model the native forward does not cover: here a GELU Llama), with a
    cached prefix and two requests packed in one forward, and one request alone."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, hidden_act="gelu",
                                         tie_word_embeddings=False)).eval()
    run = slot_runner(model, 3, 64, vocab_size=300)
    assert run.path == "transformers"
    a, b = torch.randint(0, 300, (20,)).tolist(), torch.randint(0, 300, (12,)).tolist()
    with torch.inference_mode():
        ref_a, ref_b = model(torch.tensor([a])).logits[0, 15:], model(torch.tensor([b])).logits[0, -2:]
    run.forward([ForwardItem(region(0, 64), 0, a[:15], 0)])
    got = run.forward([ForwardItem(region(0, 64), 15, a[15:], 5), ForwardItem(region(1, 64), 0, b, 2)])
    torch.testing.assert_close(got, torch.cat([ref_a, ref_b]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(run.forward([ForwardItem(region(2, 64), 0, b, 1)])[0], ref_b[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch,quantize", [*(("qwen2", mode) for mode in MODES), ("gemma3", "none")])
def test_logits_independent_of_where_the_blocks_are(models, arch, quantize):
    """A request whose blocks are scattered through the pool (its keys gathered, not sliced),
    beside requests whose blocks are consecutive, gets exactly the logits it gets in a run of
    blocks: prefill, decoding and the verification of drafts (on Gemma also through windows)."""
    loaded = models[arch]
    run = runner(loaded, quantize)
    vocab = run.vocab_size
    rng = random.Random(quantize)
    prompt = [rng.randrange(vocab) for _ in range(PROMPT_LEN)]
    follow = [rng.randrange(vocab) for _ in range(NUM_DRAFTS + 1)]
    ref_first, ref_steps = alone(run, prompt, follow)
    per = len(region(0, MAX_LEN))
    scattered = list(range(17 * per - 1, 5 * per - 1, -11))[:per]  # descending, gaps: outside regions 0-4
    assert len(scattered) == per and contiguous_base(scattered, TEST_BLOCK, PROMPT_LEN + NUM_DRAFTS + 1) is None
    beside = others(rng, vocab, 3, [2, 3, 4])
    got = run.forward([*beside[:1], ForwardItem(scattered, 0, prompt, 1), *beside[1:]])
    offset = beside[0].num_logits
    assert torch.equal(got[offset:offset + 1], ref_first)
    got = run.forward([*beside[:2], ForwardItem(scattered, PROMPT_LEN, follow, NUM_DRAFTS + 1, NUM_DRAFTS)])
    offset = beside[0].num_logits + beside[1].num_logits
    assert torch.equal(got[offset:], ref_steps)
