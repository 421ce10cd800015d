"""Reading a GGUF header's fields so that no field of an untrusted file can hang, bloat or crash us.

GGUF files come from strangers, and the header is a list of counts and lengths that a reader
trusts at its peril (llama.cpp has had CVEs in its GGUF parser): a header claiming a 2^40-byte
string made the server allocate until it was killed, and 1,000 nested arrays recursed 1,000
deep. So every count and length is checked against the bytes the file has left *before*
anything is allocated for it, against a cap where the format allows more than any real file
needs, and nesting is bounded; whatever is wrong is one ``ModelFileError`` naming the file, the
field, what was expected and what was found. Past these checks, what a parse allocates is
bounded by the file's own size (plus the caps' Python objects), and its time by one walk over
the header.

The caps are far above real files (SmolLM2's 35 keys; a 405B Llama's ~1,140 tensors; Gemma 3's
262,144-entry vocabulary) and far below what would hurt.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from specdec_core.loading.model_errors import ModelFileError

MAX_KEYS = 1 << 16  # metadata keys
MAX_TENSORS = 1 << 16  # tensor table entries
MAX_KEY_BYTES = 1 << 16  # a metadata key's name
MAX_NAME_BYTES = 256  # a tensor's name (llama.cpp allows 64)
MAX_DIMS = 4  # a tensor's dimensions (GGML_MAX_DIMS)
MAX_ARRAY_LENGTH = 1 << 24  # elements of one array (the largest vocabularies: 262,144 tokens)
MAX_ARRAY_DEPTH = 8  # arrays of arrays; llama.cpp reads none, the gguf package writes a few levels
MAX_ALIGNMENT = 1 << 20  # general.alignment: a power of two (32 by default)

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
# The fewest bytes one array element of each type takes: a claimed count is checked against it.
_MIN_ITEM_BYTES = {**{kind: struct.calcsize(fmt) for kind, fmt in SCALARS.items()}, STRING: 8, ARRAY: 12}
# Arrays this short become lists even when not asked for (the tokenizer's small settings).
_SHORT_ARRAY = 64


class Truncated(Exception):
    """The header runs past the bytes given but not past the file (a split file: read the next part)."""


class Cursor:
    """Reads fields from ``buf``, the first bytes of a file of ``total`` bytes called ``name``.

    A field that would run past ``total`` is a ``ModelFileError``; one that runs only past
    ``buf`` is ``Truncated``, so the caller can read more of a split file and start again."""

    def __init__(self, buf: Any, total: int, name: str) -> None:
        self.buf, self.total, self.name, self.pos = buf, total, name, 0

    @property
    def left(self) -> int:
        """Bytes of the file after the cursor."""
        return self.total - self.pos

    def error(self, field: str, expected: str, found: object) -> ModelFileError:
        return ModelFileError(self.name, field, expected, found)

    def need(self, n: int, field: str) -> None:
        """Check that ``n`` bytes at the cursor lie inside the file (and inside ``buf``)."""
        if n > self.left:
            raise self.error(field, f"at most the {self.left} bytes left in the file (at byte {self.pos})", n)
        if self.pos + n > len(self.buf):
            raise Truncated

    def scalar(self, fmt: str, field: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, field)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def count(self, field: str, item_bytes: int, cap: int | None = None) -> int:
        """A u64 count of items of at least ``item_bytes`` bytes each, checked before any is read."""
        n = self.scalar("<Q", field)
        if cap is not None and n > cap:
            raise self.error(field, f"at most {cap}", n)
        if n * item_bytes > self.left:
            if item_bytes == 1:
                raise self.error(field, f"at most the {self.left} bytes left in the file (at byte {self.pos})", n)
            raise self.error(field, f"at most {self.left // item_bytes} (each takes {item_bytes}+ bytes; "
                             f"{self.left} are left in the file)", n)
        return n

    def skip(self, n: int, field: str) -> None:
        self.need(n, field)
        self.pos += n

    def raw_string(self, field: str, cap: int | None = None) -> bytes:
        n = self.count(f"{field} length", 1, cap)
        self.need(n, field)
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos])

    def string(self, field: str, cap: int | None = None) -> str:
        return self.raw_string(field, cap).decode("utf-8", errors="replace")

    def value_type(self, field: str) -> int:
        kind = self.scalar("<I", field)
        if kind not in SCALARS and kind not in (STRING, ARRAY):
            raise self.error(field, "a GGUF value type (0-12)", kind)
        return kind

    def array_head(self, field: str, depth: int) -> tuple[int, int]:
        """(item type, length) of an array at nesting ``depth``, checked against the bytes left."""
        item = self.value_type(f"{field} item type")
        if item == ARRAY and depth + 1 >= MAX_ARRAY_DEPTH:
            raise self.error(f"{field} item type", f"arrays nested at most {MAX_ARRAY_DEPTH} deep",
                             f"arrays nested {depth + 2} deep")
        return item, self.count(f"{field} length", _MIN_ITEM_BYTES[item], MAX_ARRAY_LENGTH)

    def value(self, kind: int, keep: bool, field: str, depth: int = 0) -> Any:
        """A metadata value of type ``kind``. Arrays of numbers are numpy arrays (lists when short
        or kept); arrays of strings or of arrays are checked, not decoded, and stand as their
        length unless ``keep``."""
        if kind in SCALARS:
            return self.scalar(SCALARS[kind], field)
        if kind == STRING:
            return self.string(field)
        item, n = self.array_head(field, depth)
        if item in _NUMPY:
            dtype = np.dtype(_NUMPY[item])
            self.need(dtype.itemsize * n, field)
            values = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).copy()
            self.pos += dtype.itemsize * n
            return values.tolist() if keep or n <= _SHORT_ARRAY else values
        if keep:
            return [self.value(item, True, field, depth + 1) for _ in range(n)]
        self.walk_items(item, n, field, depth + 1)
        return n

    def walk_items(self, kind: int, n: int, field: str, depth: int) -> None:
        """Check ``n`` values of type ``kind`` and move past them, keeping nothing (a vocabulary's
        strings are walked this way on every start: the loop stays lean)."""
        if kind in SCALARS:
            self.skip(struct.calcsize(SCALARS[kind]) * n, field)
        elif kind == STRING:
            length = f"{field} item length"
            for _ in range(n):
                self.skip(self.count(length, 1), field)
        else:
            for _ in range(n):
                item, items = self.array_head(field, depth)
                self.walk_items(item, items, field, depth + 1)
