"""Hostile GGUF files (issue 64): each malformed header, and each file whose tensors are not the
model its metadata describes, is one ``ModelFileError`` naming the file and the field, raised
before anything is allocated for it; never a hang, a huge allocation, a RecursionError or a
model that serves and then fails every request. The cases probed at the commit before these
checks: a 2^40-byte string (allocated until killed at 6 GB), 2^40 tensors, keys and array
elements, 1,000 nested arrays (a 1,000-frame traceback), an embedding of 100 rows for the
vocabulary and an output projection with swapped dimensions (both served)."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.gguf_linear import BlockWeight
from specdec_core.execution.gguf_weights import BLOCKS_ATTRIBUTE, attach_block_weights
from specdec_core.loading.gguf_file import read_gguf
from specdec_core.loading.gguf_header import MAX_ARRAY_DEPTH
from specdec_core.loading.loader import load_model
from specdec_core.loading.model_errors import ModelFileError
from tests.helpers.gguf_raw import (
    ARRAY,
    GGML_F32,
    GGML_Q8_0,
    STRING,
    U32,
    gguf_bytes,
    nested_array,
    small_model_file,
    tensor_bytes,
)
from tests.helpers.gguf_writer import write_phi3_gguf

HUGE = 1 << 40
ARCH = ("general.architecture", STRING, "llama")
EMBD = ("token_embd.weight", (32, 24), GGML_Q8_0, tensor_bytes((32, 24), GGML_Q8_0))


def mutated(metadata, tensors=(), *, role: str, nth: int, value: int, **kwargs) -> bytes:
    """A file of ``metadata`` and ``tensors`` whose ``nth`` field of ``role`` says ``value``."""
    data, fields = gguf_bytes(metadata, tensors, **kwargs)
    where = [f for f in fields if f.role == role][nth]
    return data[:where.offset] + value.to_bytes(where.size, "little") + data[where.offset + where.size:]


def overlapping() -> bytes:
    norm = tensor_bytes((32,), GGML_F32)
    return gguf_bytes([ARCH], [("a.weight", (32,), GGML_F32, norm), ("b.weight", (32,), GGML_F32, norm)],
                      offsets={"b.weight": 64 - 32})[0]  # b starts where a's 128 bytes are still running


# (case, file bytes, what the message must name)
MALFORMED = [
    ("a 2^40-byte string", mutated([("general.name", STRING, "x" * 8)], role="length", nth=1, value=HUGE),
     "general.name length"),
    ("2^40 tensors", mutated([ARCH], role="count", nth=0, value=HUGE), "tensor count"),
    ("2^40 keys", mutated([ARCH], role="count", nth=1, value=HUGE), "metadata key count"),
    ("2^40 array elements", mutated([("a", ARRAY, (U32, [1, 2]))], role="length", nth=1, value=HUGE), "a length"),
    ("1,000 nested arrays", gguf_bytes([("deep", ARRAY, nested_array(1000))])[0], "deep item"),
    ("arrays one level too deep", gguf_bytes([("deep", ARRAY, nested_array(MAX_ARRAY_DEPTH + 1))])[0], "deep item"),
    ("an unknown value type", mutated([ARCH], role="type", nth=0, value=13), "general.architecture type"),
    ("a key twice", gguf_bytes([ARCH, ARCH])[0], "general.architecture"),
    ("version 1", gguf_bytes([ARCH], version=1)[0], "version"),
    ("a big-endian file", gguf_bytes([ARCH], version=3 << 24)[0], "version"),
    ("not a GGUF", b"GGML" + gguf_bytes([ARCH])[0][4:], "magic"),
    ("an empty file", b"", "header"),
    ("a truncated header", gguf_bytes([ARCH, ("general.name", STRING, "tiny")])[0].rstrip(b"\0")[:-2], "general.name"),
    ("an unknown tensor type", gguf_bytes([ARCH], [("t", (32,), 99, bytes(128))])[0], "t type"),
    ("five dimensions", gguf_bytes([ARCH], [("t", (1, 1, 1, 1, 32), GGML_F32, bytes(128))])[0], "t dimension count"),
    ("a zero dimension", gguf_bytes([ARCH], [("t", (32, 0), GGML_F32, b"")])[0], "t dimensions"),
    ("rows of part of a block", gguf_bytes([ARCH], [("t", (16, 2), GGML_Q8_0, bytes(34))])[0], "t dimensions"),
    ("a tensor past the end", gguf_bytes([ARCH], [EMBD])[0][:-100], "token_embd.weight data"),
    ("a tensor at 2^40", mutated([ARCH], [EMBD], role="offset", nth=0, value=HUGE), "token_embd.weight data"),
    ("an unaligned offset", mutated([ARCH], [EMBD], role="offset", nth=0, value=4), "token_embd.weight offset"),
    ("overlapping tensors", overlapping(), "b.weight data"),
    ("a tensor twice", gguf_bytes([ARCH], [EMBD, EMBD])[0], "token_embd.weight"),
    ("an alignment of 3", gguf_bytes([ARCH, ("general.alignment", U32, 3)], [EMBD])[0], "general.alignment"),
]


@pytest.mark.parametrize("data, field", [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_a_malformed_header_is_one_error_naming_the_file_and_the_field(tmp_path: Path, data: bytes, field: str):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ModelFileError) as raised:
            read_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(raised.value)
    assert message.startswith(f"bad.gguf: {field}") and "expected" in message and "\n" not in message, message
    assert peak < len(data) + (1 << 20)  # the 2^40 claims allocated nothing
    assert time.perf_counter() - started < 5  # generous: a claim is refused before it is walked


def test_the_fuzzers_seed_and_an_empty_metadata_file_parse(tmp_path: Path):
    """The valid files above are valid: arrays of arrays, all scalar types, three tensor types."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(small_model_file()[0])
    file = read_gguf(path)
    assert file.metadata["small.nested"] == 3 and file.metadata["tokenizer.ggml.tokens"] == 24
    assert {name: info.shape for name, info in file.tensors.items()} == {
        "token_embd.weight": (32, 24), "blk.0.attn_norm.weight": (32,), "output.weight": (32, 24)}
    assert file.read("output.weight").shape == (24, 64)
    path.write_bytes(gguf_bytes([])[0])  # no keys, no tensors, no data section
    assert read_gguf(path).tensors == {}
    with pytest.raises(ModelFileError, match="general.architecture: expected"):
        _ = read_gguf(path).architecture


@pytest.fixture(scope="module")
def profile() -> DeviceProfile:
    return DeviceProfile.decide("cpu", "float32", "gguf")


def phi3_load_error(tmp_path: Path, profile: DeviceProfile, **kwargs) -> str:
    path = write_phi3_gguf(tmp_path / "tiny-phi3.gguf", **kwargs)
    with pytest.raises(ModelFileError) as raised:
        load_model(str(path), role="target", profile=profile, cache_dir=tmp_path / "cache", progress=False)
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_an_embedding_of_100_rows_for_the_vocabulary_is_refused(tmp_path: Path, profile: DeviceProfile):
    """Served before: every request then failed (489 tokens, 100 rows to look them up in)."""
    message = phi3_load_error(tmp_path, profile, shapes={"token_embd.weight": (100, 256)})
    assert message == ("tiny-phi3.gguf: token_embd.weight rows: expected 489, the vocabulary "
                       "(tokenizer.ggml.tokens), found 100")


def test_an_output_projection_with_swapped_dimensions_is_refused(tmp_path: Path, profile: DeviceProfile):
    """Served before: the kernels take a weight's row length from its blocks."""
    message = phi3_load_error(tmp_path, profile, shapes={"output.weight": (256, 489)}, types={"output": 0})
    assert message == ("tiny-phi3.gguf: output.weight dimensions: expected [256, 489] (hidden size, vocabulary), "
                       "found [489, 256]")


def test_a_layer_tensor_of_the_wrong_shape_is_refused(tmp_path: Path, profile: DeviceProfile):
    message = phi3_load_error(tmp_path, profile, shapes={"blk.1.ffn_down.weight": (256, 256)})
    assert message.startswith("tiny-phi3.gguf: blk.1.ffn_down.weight dimensions: expected [512, 256] for "
                              "model.layers.1.mlp.down_proj.weight") and message.endswith("found [256, 256]")


@pytest.mark.parametrize("key, value, message", [
    ("llama.block_count", HUGE, "llama.block_count: expected at most the 1 layers the tensors hold (blk.N.*), "
                                f"found {HUGE}"),
    ("llama.embedding_length", 64, "llama.embedding_length: expected 32 (token_embd.weight's first dimension), found 64"),
    ("llama.attention.head_count", HUGE, f"llama.attention.head_count: expected at most 32, the largest dimension "
                                         f"of any tensor, found {HUGE}"),
    ("llama.context_length", 0, "llama.context_length: expected a positive integer, found 0"),
    ("llama.attention.head_count", None, "llama.attention.head_count: expected a positive integer, found no such key"),
])
def test_metadata_that_would_size_the_model_beyond_its_tensors_is_refused(tmp_path: Path, key, value, message):
    """Checked before the model is built: a block count of 2^40 built layers until killed."""
    from specdec_core.loading.gguf_model import gguf_config

    metadata = [ARCH, ("llama.block_count", U32, 1), ("llama.embedding_length", U32, 32),
                ("llama.attention.head_count", U32, 4), ("llama.context_length", U32, 128),
                ("tokenizer.ggml.tokens", ARRAY, (STRING, [f"t{i}" for i in range(24)]))]
    metadata = [(k, 10 if k == key else kind, value if k == key else v)  # 10: u64; None: no such key
                for k, kind, v in metadata if k != key or value is not None]
    path = tmp_path / "small.gguf"
    path.write_bytes(gguf_bytes(metadata, [EMBD, ("blk.0.attn_norm.weight", (32,), GGML_F32, bytes(128))])[0])
    with pytest.raises(ModelFileError) as raised:
        gguf_config(read_gguf(path))
    assert str(raised.value) == f"small.gguf: {message}"


def test_blocks_that_are_not_their_modules_dimensions_never_reach_the_kernels():
    """The last check before the kernels (execution), for blocks from anywhere."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 8))
    setattr(model, BLOCKS_ATTRIBUTE, {"0": BlockWeight(GGML_Q8_0, torch.zeros(64, 34, dtype=torch.uint8), 32)})
    with pytest.raises(ValueError, match=r"the blocks for 0 are \[64, 32\].*the module is \[8, 64\]"):
        attach_block_weights(model)
