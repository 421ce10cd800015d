"""GGUF files written field by field, remembering where each field is, for the reader's hostile-file
tests (``tests/loading/test_gguf_validation.py``, ``test_gguf_fuzz.py``).

Why not ``gguf.GGUFWriter``: it refuses to write what these tests need (a count that lies, a
type that does not exist, 1,000 nested arrays, tensors that overlap), and it does not say where
it put a field, which a fuzzer mutating counts and lengths needs to know. Every field written
is recorded as a ``Field`` (its offset, size in bytes and role), so a test can overwrite exactly
the tensor count, a string's length or a tensor's offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
            I64: "<q", F64: "<d"}
# GGML tensor types used here, and (values per block, bytes per block)
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
_BLOCKS = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q8_0: (32, 34)}


@dataclass(frozen=True)
class Field:
    offset: int
    size: int  # bytes: 4 or 8 for the counts and types mutated; a scalar value's own size
    role: str  # "count", "length", "type", "ndims", "dim", "offset", "version", "value"


@dataclass
class RawGGUF:
    """A GGUF file's bytes as written so far, and where each field is."""

    data: bytearray = field(default_factory=bytearray)
    fields: list[Field] = field(default_factory=list)

    def put(self, fmt: str, value: Any, role: str | None = None) -> None:
        if role is not None:
            self.fields.append(Field(len(self.data), struct.calcsize(fmt), role))
        self.data += struct.pack(fmt, value)

    def string(self, text: str | bytes) -> None:
        raw = text.encode() if isinstance(text, str) else text
        self.put("<Q", len(raw), "length")
        self.data += raw

    def value(self, kind: int, value: Any) -> None:
        """A metadata value of type ``kind``; an array is ``(item type, [items])``, or its bytes."""
        if isinstance(value, bytes) and kind == ARRAY:
            self.data += value
        elif kind == STRING:
            self.string(value)
        elif kind == ARRAY:
            item, items = value
            self.put("<I", item, "type")
            self.put("<Q", len(items), "length")
            for x in items:
                self.value(item, x)
        else:
            self.put(_FORMATS[kind], value, "value")


def gguf_bytes(metadata: list[tuple[str, int, Any]], tensors: list[tuple[str, tuple[int, ...], int, bytes]] = (),
               *, version: int = 3, alignment: int = 32, offsets: dict[str, int] | None = None
               ) -> tuple[bytes, list[Field]]:
    """A GGUF file of ``metadata`` ((key, type, value), written in order) and ``tensors`` ((name,
    dims innermost first, GGML type, bytes)), each tensor's bytes at the next aligned offset
    unless ``offsets`` names another. Returns the bytes and where each field is."""
    out = RawGGUF()
    out.data += b"GGUF"
    out.put("<I", version, "version")
    out.put("<Q", len(tensors), "count")
    out.put("<Q", len(metadata), "count")
    for key, kind, value in metadata:
        out.string(key)
        out.put("<I", kind, "type")
        out.value(kind, value)
    placed, at = [], 0
    for name, dims, ggml_type, raw in tensors:
        out.string(name)
        out.put("<I", len(dims), "ndims")
        for d in dims:
            out.put("<Q", d, "dim")
        out.put("<I", ggml_type, "type")
        offset = (offsets or {}).get(name, at)
        out.put("<Q", offset, "offset")
        placed.append((offset, raw))
        at = (max(at, offset + len(raw)) + alignment - 1) // alignment * alignment
    start = (len(out.data) + alignment - 1) // alignment * alignment
    body = bytearray(at)
    for offset, raw in placed:
        body[offset:offset + len(raw)] = raw
    return bytes(out.data) + bytes(start - len(out.data)) + bytes(body), out.fields


def nested_array(depth: int) -> bytes:
    """An array value (after its type) nested ``depth`` arrays deep, the innermost one byte; as
    bytes, because written as nested values it would take this writer ``depth`` frames too."""
    return (struct.pack("<IQ", ARRAY, 1) * (depth - 1)) + struct.pack("<IQB", U8, 1, 1)


def tensor_bytes(dims: tuple[int, ...], ggml_type: int, fill: int = 0) -> bytes:
    """Bytes of a tensor of ``dims`` (innermost first) of ``ggml_type`` (F32, F16 or Q8_0)."""
    block, size = _BLOCKS[ggml_type]
    count = 1
    for d in dims:
        count *= d
    return bytes([fill]) * (count // block * size)


def small_model_file() -> tuple[bytes, list[Field]]:
    """A small valid GGUF using every kind of field: scalars of each type, strings, arrays of
    numbers, of strings and of arrays, and tensors of three types. The fuzzer's seed (~2 KB)."""
    tokens = [f"tok{i}" for i in range(24)]
    metadata = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "tiny"),
        ("general.alignment", U32, 32),
        ("llama.block_count", U32, 1),
        ("llama.context_length", U64, 128),
        ("llama.embedding_length", U32, 32),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", F64, 1e-5),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
        ("tokenizer.ggml.bos_token_id", I32, 1),
        ("small.u8", U8, 7), ("small.i8", I8, -7), ("small.u16", U16, 700), ("small.i16", I16, -700),
        ("small.i64", I64, -(1 << 40)),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.scores", ARRAY, (F32, [float(-i) for i in range(24)])),
        ("small.nested", ARRAY, (ARRAY, [(U16, [1, 2, 3]), (STRING, ["a", "bc"]), (ARRAY, [(U8, [9])])])),
    ]
    tensors = [
        ("token_embd.weight", (32, 24), GGML_Q8_0, tensor_bytes((32, 24), GGML_Q8_0, 1)),
        ("blk.0.attn_norm.weight", (32,), GGML_F32, tensor_bytes((32,), GGML_F32, 2)),
        ("output.weight", (32, 24), GGML_F16, tensor_bytes((32, 24), GGML_F16, 3)),
    ]
    return gguf_bytes(metadata, tensors)
