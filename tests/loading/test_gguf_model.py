"""A GGUF served from its file (``loading.gguf_model``): the same model, bit for bit, as the
converted fp32 checkpoint served by the same block kernels, without writing anything; and the
converted model the one transformers reads from the file (for Phi-3's LongRoPE and partial rotary,
which transformers' GGUF loading drops, the model the file was written from)."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import gguf
import pytest
import torch

from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.forward_plan import ForwardItem
from specdec_core.execution.gguf_linear import GGUFLinear
from specdec_core.loading.gguf_file import read_gguf
from specdec_core.loading.loader import load_model
from tests.helpers.gguf_writer import write_phi3_gguf
from tests.helpers.models import load
from tests.helpers.runners import region, slot_runner

PROMPT = "def quicksort(arr):\n    <|im_start|>  x"


def converted_and_transformers_reading(path: Path):
    """The converted model of ``path`` and transformers' own GGUF reading of it, after checking
    that they hold the same tensors, name for name and bit for bit."""
    from transformers import AutoModelForCausalLM

    converted = load(path)
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32, attn_implementation="sdpa").eval()
    ours, theirs = converted.model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    return converted, reference


def assert_served_is_converted(served, converted, prompt: str) -> torch.Tensor:
    """The model served from the file is the converted one: config, token ids, chat template and
    the block kernels' logits (``torch.equal``; the served side also runs the embedding's blocks).
    Returns the logits of ``prompt``."""
    ignore = {"_name_or_path", "architectures", "_model_name_or_path"}
    assert {k: v for k, v in served.model.config.to_dict().items() if k not in ignore} == \
        {k: v for k, v in converted.model.config.to_dict().items() if k not in ignore}
    ids = served.tokenizer(prompt)["input_ids"]
    assert ids == converted.tokenizer(prompt)["input_ids"]
    assert served.tokenizer.chat_template == converted.tokenizer.chat_template
    vocab = served.model.config.vocab_size
    got = slot_runner(served.model, 2, 64, vocab_size=vocab, quantize="gguf")
    ref = slot_runner(converted.model, 2, 64, vocab_size=vocab, quantize="gguf")
    assert got.path == "native" and got.block_layers == ref.block_layers + 1
    items = [ForwardItem(region(0, 64), 0, ids, len(ids))]
    logits = got.forward(items)
    assert torch.equal(logits, ref.forward(items))
    return logits
# 27 tokens of the tiny Phi-3 vocabulary: past PHI4_ORIGINAL, so both LongRoPE factor sets are used
PHI3_PROMPT = "<|user|>\ndef fibonacci(n):\n    return sorted(arr) if n else x<|end|>\n<|assistant|>\n"
PHI4_ORIGINAL = 16  # the tiny Phi-4-mini's original_max_position_embeddings
PHI4_LONG = [2.0 + 0.25 * i for i in range(24)]  # float32-exact, as the file stores them
PHI4_SHORT = [1.0 + 0.125 * i for i in range(24)]


@pytest.fixture(scope="module")
def phi3_gguf(tmp_path_factory) -> Path:
    """A tiny random Phi-3-mini (4k): full rotary, no LongRoPE, untied head, sentencepiece vocab."""
    return write_phi3_gguf(tmp_path_factory.mktemp("phi3") / "tiny-phi3.gguf")


@pytest.fixture(scope="module")
def phi4_gguf(tmp_path_factory) -> Path:
    """A tiny random Phi-4-mini: 48 of 64 dims rotated, LongRoPE, head tied to the embedding."""
    return write_phi3_gguf(tmp_path_factory.mktemp("phi4") / "tiny-phi4.gguf", rope_dims=48, tied=True,
                           original_context=PHI4_ORIGINAL, long_factors=PHI4_LONG, short_factors=PHI4_SHORT,
                           sliding_window=0, seed=1)


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
    assert served.path == smol_gguf and served.source is not None and served.source.parts == (smol_gguf,)
    assert not cache.exists() or not any(cache.rglob("*"))
    assert {p.numel() for p in served.model.model.layers[0].self_attn.q_proj.parameters()} == {0}  # blocks only
    assert_served_is_converted(served, load(smol_gguf), PROMPT)


def test_a_runner_that_owns_the_model_keeps_only_the_repacked_blocks(smol_gguf, tmp_path):
    """The engine's runners own their models: once prepared, the blocks in the file's layout are
    freed where the kernels run repacked copies (only the embedding's stay, for the lookups; the
    tied head shares them, and formats run as stored keep theirs), and the logits are those of a
    runner that leaves the model as it was."""
    profile = DeviceProfile.decide("cpu", "float32", "gguf")
    shared, owned = (load_model(str(smol_gguf), role="target", profile=profile, cache_dir=tmp_path, progress=False)
                     for _ in range(2))
    vocab = shared.model.config.vocab_size
    ids = shared.tokenizer(PROMPT)["input_ids"]
    items = [ForwardItem(region(0, 64), 0, ids, len(ids))]
    files = {name: weakref.ref(weight.blocks) for name, weight in owned.model.specdec_blocks.items()}
    keeps = slot_runner(shared.model, 2, 64, vocab_size=vocab, quantize="gguf")
    frees = slot_runner(owned.model, 2, 64, vocab_size=vocab, quantize="gguf", release_weights=True)
    assert torch.equal(frees.forward(items), keeps.forward(items))
    gc.collect()
    run_as_stored = {id(data) for m in frees.native.modules() if isinstance(m, GGUFLinear) for _, data, _ in m.calls}
    alive = {name: ref() for name, ref in files.items() if ref() is not None}  # Q4_1 runs in the file's layout
    assert sorted(name for name, t in alive.items() if id(t) not in run_as_stored) == ["lm_head", "model.embed_tokens"]
    assert len(alive) < len(files) and not hasattr(owned.model, "specdec_blocks")
    assert len(shared.model.specdec_blocks) == len(files)  # a runner that does not own the model leaves them


@pytest.mark.slow
def test_converted_checkpoint_is_transformers_own_reading(smol_gguf):
    """The fp32 checkpoint written for the other modes (read and dequantized here, not by
    transformers' slower loader) holds exactly what transformers' GGUF loading gives, tensor for
    tensor, and with its config gives the same logits."""

    converted, reference = converted_and_transformers_reading(smol_gguf)
    ids = converted.tokenizer("def fibonacci(n):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(converted.model(ids).logits, reference(ids).logits)


def test_other_modes_take_the_converted_path(smol_gguf):
    """fp32 needs dense weights: the loader converts (once) rather than serve empty placeholders."""
    loaded = load_model(str(smol_gguf), role="target", profile=DeviceProfile.decide("cpu", "float32", "none"),
                        cache_dir=Path(os.environ["SPECDEC_CACHE_DIR"]), progress=False)
    assert loaded.path.is_dir() and loaded.model.model.layers[0].self_attn.q_proj.weight.numel() > 0


@pytest.mark.slow
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


@pytest.mark.parametrize("name", ["phi3_gguf", "phi4_gguf"])
def test_phi3_from_the_file(name, request, tmp_path):
    """Phi-3's fused qkv and gate_up blocks, partial rotary dims and LongRoPE factors from the file:
    the converted model's config, tokenizer and logits (``torch.equal``, positions on both sides of
    the original context), nothing written."""
    path: Path = request.getfixturevalue(name)
    cache = tmp_path / "cache"
    served = load_model(str(path), role="target", profile=DeviceProfile.decide("cpu", "float32", "gguf"),
                        cache_dir=cache, progress=False)
    assert not cache.exists() or not any(cache.rglob("*"))
    attn = served.model.model.layers[0].self_attn
    assert {p.numel() for p in (*attn.qkv_proj.parameters(), *served.model.model.layers[0].mlp.gate_up_proj.parameters())} == {0}
    assert len(served.tokenizer(PHI3_PROMPT)["input_ids"]) > PHI4_ORIGINAL
    assert torch.isfinite(assert_served_is_converted(served, load(path), PHI3_PROMPT)).all()


def test_phi3_converted_is_transformers_own_reading(phi3_gguf):
    """A Phi-3 without LongRoPE: the converted model is transformers' GGUF reading, config, tensor
    for tensor (the fused qkv and gate_up rows in the file's order) and logits, and the tokenizer
    its GGUF tokenizer (Phi-3's sentencepiece normalizer, control tokens, chat template)."""
    from transformers import AutoTokenizer

    converted, reference = converted_and_transformers_reading(phi3_gguf)
    ignore = {"_name_or_path", "architectures", "_model_name_or_path", "dtype", "quantization_config"}
    assert {k: v for k, v in converted.model.config.to_dict().items() if k not in ignore} == \
        {k: v for k, v in reference.config.to_dict().items() if k not in ignore}
    tokenizer = AutoTokenizer.from_pretrained(str(phi3_gguf.parent), gguf_file=phi3_gguf.name)
    ids = tokenizer(PHI3_PROMPT, return_tensors="pt").input_ids
    assert ids[0].tolist() == converted.tokenizer(PHI3_PROMPT)["input_ids"]
    assert converted.tokenizer.chat_template == tokenizer.chat_template
    with torch.no_grad():
        assert torch.equal(converted.model(ids).logits, reference(ids).logits)


def test_phi3_longrope_is_the_model_the_file_was_written_from(phi4_gguf):
    """A Phi-4-mini's LongRoPE factors, original context and rotary dims, which transformers' GGUF
    loading drops (it reads the tensors, tensor for tensor the converted ones, under plain
    full-width RoPE): the converted model gives the logits of transformers' Phi-3 with the config
    the file was written from, below the original context (short factors) and past it (long)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    converted, reference = converted_and_transformers_reading(phi4_gguf)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": PHI4_ORIGINAL, "long_factor": PHI4_LONG, "short_factor": PHI4_SHORT}
    assert converted.model.config.rope_parameters == rope
    truth = Phi3ForCausalLM(Phi3Config(**{**reference.config.to_dict(), "rope_parameters": rope,
                                          "original_max_position_embeddings": PHI4_ORIGINAL}))
    truth.load_state_dict(reference.state_dict())
    truth.eval()
    ids = converted.tokenizer(PHI3_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        for n in (PHI4_ORIGINAL, ids.shape[1]):
            assert torch.equal(converted.model(ids[:, :n]).logits, truth(ids[:, :n]).logits)
