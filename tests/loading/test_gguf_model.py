"""A GGUF served from its file (``loading.gguf_model``): the same model, bit for bit, as the
converted fp32 checkpoint served by the same block kernels, without writing anything."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest
import torch

from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.gguf_file import read_gguf
from specdec_core.loading.loader import load_model
from tests.helpers.models import load
from tests.helpers.runners import region, slot_runner

PROMPT = "def quicksort(arr):\n    <|im_start|>  x"


def test_table_is_the_gguf_packages(smol_gguf):
    """Every tensor's type, shape, offset and size, and the metadata the config is built from."""
    ours = read_gguf(smol_gguf)
    reader = gguf.GGUFReader(str(smol_gguf))
    assert {t.name: (int(t.tensor_type), tuple(int(s) for s in t.shape), int(t.data_offset), int(t.n_bytes))
            for t in reader.tensors} == {name: (i.ggml_type, i.shape, i.offset, i.nbytes) for name, i in ours.tensors.items()}
    assert ours.metadata["llama.block_count"] == 30
    assert ours.metadata["tokenizer.ggml.tokens"] == 49152  # a string array not asked for: its length
    assert ours.metadata["tokenizer.chat_template"].startswith("{% for message in messages %}")


def test_served_from_the_file_is_the_converted_model(smol_gguf, tmp_path):
    """Config, tokenizer and logits (``torch.equal``) are the converted model's; the cache dir
    stays empty (no fp32 checkpoint, no tensor table)."""
    cache = tmp_path / "cache"
    served = load_model(str(smol_gguf), role="target",
                        profile=DeviceProfile.decide("cpu", "float32", "gguf"), cache_dir=cache, progress=False)
    assert served.path == smol_gguf
    assert not cache.exists() or not any(cache.rglob("*"))
    assert {p.numel() for p in served.model.model.layers[0].self_attn.q_proj.parameters()} == {0}  # blocks only
    converted = load(smol_gguf)
    ignore = {"_name_or_path", "architectures", "_model_name_or_path"}
    assert {k: v for k, v in served.model.config.to_dict().items() if k not in ignore} == \
        {k: v for k, v in converted.model.config.to_dict().items() if k not in ignore}
    ids = served.tokenizer(PROMPT)["input_ids"]
    assert ids == converted.tokenizer(PROMPT)["input_ids"]
    assert served.tokenizer.chat_template == converted.tokenizer.chat_template
    vocab = served.model.config.vocab_size
    got = slot_runner(served.model, 2, 64, vocab_size=vocab, quantize="gguf")
    ref = slot_runner(converted.model, 2, 64, vocab_size=vocab, quantize="gguf")
    assert got.path == "native" and got.block_layers == ref.block_layers + 1  # + the embedding's blocks
    items = [ForwardItem(region(0, 64), 0, ids, len(ids))]
    assert torch.equal(got.forward(items), ref.forward(items))


@pytest.mark.slow
def test_converted_checkpoint_is_transformers_own_reading(smol_gguf):
    """The fp32 checkpoint written for the other modes (read and dequantized here, not by
    transformers' slower loader) holds exactly what transformers' GGUF loading gives, tensor for
    tensor, and with its config gives the same logits."""
    from transformers import AutoModelForCausalLM

    converted = load(smol_gguf)
    reference = AutoModelForCausalLM.from_pretrained(str(smol_gguf.parent), gguf_file=smol_gguf.name,
                                                     dtype=torch.float32, attn_implementation="sdpa").eval()
    ours, theirs = converted.model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    ids = converted.tokenizer("def fibonacci(n):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(converted.model(ids).logits, reference(ids).logits)


def test_other_modes_take_the_converted_path(smol_gguf):
    """fp32 needs dense weights: the loader converts (once) rather than serve empty placeholders."""
    loaded = load_model(str(smol_gguf), role="target", profile=DeviceProfile.decide("cpu", "float32", "none"),
                        cache_dir=Path(os.environ["SPECDEC_CACHE_DIR"]), progress=False)
    assert loaded.path.is_dir() and loaded.model.model.layers[0].self_attn.q_proj.weight.numel() > 0


@pytest.mark.slow
def test_gemma3_from_the_file(gemma3_gguf, tmp_path):
    """Gemma 3's norms (stored with llama.cpp's +1), tied head and sliding windows from the file:
    the converted model's logits, bit for bit, in a few seconds and without writing anything."""
    cache = tmp_path / "cache"
    served = load_model(str(gemma3_gguf), role="target",
                        profile=DeviceProfile.decide("cpu", "float32", "gguf"), cache_dir=cache, progress=False)
    assert not cache.exists() or not any(cache.rglob("*"))
    converted = load(gemma3_gguf)
    ids = served.tokenizer("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")["input_ids"]
    vocab = served.model.config.vocab_size
    got = slot_runner(served.model, 2, 64, vocab_size=vocab, quantize="gguf")
    ref = slot_runner(converted.model, 2, 64, vocab_size=vocab, quantize="gguf")
    items = [ForwardItem(region(0, 64), 0, ids, len(ids))]
    assert torch.equal(got.forward(items), ref.forward(items))


def test_a_draft_head_over_part_of_the_vocabulary(smol_gguf, tmp_path):
    """A draft's frequent-vocabulary head (``head_rows``) of a file-served model takes those rows of
    the tied head's blocks: its logits are the full head's for those ids, -inf elsewhere."""
    served = load_model(str(smol_gguf), role="draft",
                        profile=DeviceProfile.decide("cpu", "float32", "gguf"), cache_dir=tmp_path, progress=False)
    vocab = served.model.config.vocab_size
    rows = list(range(0, vocab, 7))
    ids = served.tokenizer(PROMPT)["input_ids"]
    items = [ForwardItem(region(0, 64), 0, ids, 3)]
    full = slot_runner(served.model, 2, 64, vocab_size=vocab, quantize="gguf").forward(items)
    part = slot_runner(served.model, 2, 64, vocab_size=vocab, quantize="gguf", head_rows=rows).forward(items)
    assert torch.equal(part[:, rows], full[:, rows])
    assert torch.isinf(part[:, 1]).all()
