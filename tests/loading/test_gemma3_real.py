"""The real Gemma 3 270M (Q4_K_M GGUF from PyPI) on the native path: its sliding-window and
global layers, query/key norms, sandwich norms and GELU gate computed as transformers computes
them (greedy tokens equal in fp32), its quantized blocks served by the block kernels, and the
model served straight from the file equal to the converted one."""

from __future__ import annotations

import pytest
import torch

from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.loading.loader import load_model
from tests.helpers.models import load
from tests.helpers.runners import region, slot_runner

pytestmark = pytest.mark.slow

# Gemma's turn format (the file has no chat template of its own)
PROMPT = "<start_of_turn>user\nWrite a Python function that reverses a string.<end_of_turn>\n<start_of_turn>model\n"
TOKENS = 16
MAX_LEN = 256


@pytest.fixture(scope="module")
def gemma(gemma3_gguf):
    return load(gemma3_gguf)


def greedy(run, prompt: list[int]) -> list[int]:
    logits = run.forward([ForwardItem(region(0, MAX_LEN), 0, prompt, 1)])
    out: list[int] = []
    for i in range(TOKENS):
        out.append(int(logits[0].argmax()))
        logits = run.forward([ForwardItem(region(0, MAX_LEN), len(prompt) + i, [out[-1]], 1)])
    return out


def test_native_fp32_greedy_equals_transformers(gemma):
    prompt = gemma.tokenizer(PROMPT)["input_ids"]
    assert prompt[:2] == [gemma.tokenizer.bos_token_id, gemma.tokenizer.convert_tokens_to_ids("<start_of_turn>")]
    run = slot_runner(gemma.model, 2, MAX_LEN, vocab_size=gemma.model.config.vocab_size, quantize="none")
    assert run.path == "native"
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(TOKENS):
            ids.append(int(gemma.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert greedy(run, prompt) == ids[len(prompt):]


def test_gguf_blocks_serve_every_linear(gemma):
    """Every projection and the tied head run on the file's own blocks; the first tokens are the
    fp32 model's (the kernels quantize activations to 8 bits, so later ones may part)."""
    prompt = gemma.tokenizer(PROMPT)["input_ids"]
    run = slot_runner(gemma.model, 2, MAX_LEN, vocab_size=gemma.model.config.vocab_size, quantize="gguf")
    assert run.path == "native" and run.block_layers == 7 * gemma.model.config.num_hidden_layers + 1
    fp32 = slot_runner(gemma.model, 2, MAX_LEN, vocab_size=gemma.model.config.vocab_size, quantize="none")
    assert greedy(run, prompt)[:4] == greedy(fp32, prompt)[:4]


def test_native_fp32_rows_past_the_window_equal_transformers(gemma):
    """A 700-token input: its last rows attend through the 512-key windows of the sliding layers
    and over every key in the global ones."""
    text = "def f(x):\n    return x * 2  # doubles\n" * 60
    ids = gemma.tokenizer(text)["input_ids"][:700]
    assert len(ids) == 700
    run = slot_runner(gemma.model, 1, 1024, vocab_size=gemma.model.config.vocab_size, quantize="none")
    assert {layer.window for layer in run.native.layers} == {None, 512}  # global and sliding layers
    with torch.inference_mode():
        ref = gemma.model(torch.tensor([ids])).logits[0, -40:].float()
    got = run.forward([ForwardItem(region(0, 1024), 0, ids, 40)])
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=2e-3)


def test_served_from_the_file_is_the_converted_model(gemma, gemma3_gguf, tmp_path):
    """Gemma 3's norms (stored with llama.cpp's +1), tied head and sliding windows from the file:
    the converted model's logits (``gemma``), bit for bit, without writing anything."""
    cache = tmp_path / "cache"
    served = load_model(str(gemma3_gguf), role="target",
                        profile=DeviceProfile.decide("cpu", "float32", "gguf"), cache_dir=cache, progress=False)
    assert not cache.exists() or not any(cache.rglob("*"))
    ids = served.tokenizer("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")["input_ids"]
    vocab = served.model.config.vocab_size
    got = slot_runner(served.model, 2, 64, vocab_size=vocab, quantize="gguf")
    ref = slot_runner(gemma.model, 2, 64, vocab_size=vocab, quantize="gguf")
    items = [ForwardItem(region(0, 64), 0, ids, len(ids))]
    assert torch.equal(got.forward(items), ref.forward(items))
