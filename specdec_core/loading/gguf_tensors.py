"""A GGUF file's tensor table, checked against the file before any tensor is read.

Why: the loader reads every tensor a table names, allocating what the entry claims. An entry
whose bytes run past the file would fail only then, minutes into a load; entries that overlap
(all pointing at one stretch of the data) would make a small file load as a huge model; an
unknown type has no size at all; and a row length that is no whole number of blocks makes every
later computation of the tensor's bytes wrong. So each entry is checked here, as llama.cpp's
reader checks it: a known type, positive dimensions, whole blocks per row, an offset on the
file's alignment, its bytes inside the data section and overlapping no other entry's. What the
tensors must be for the model the metadata describes is checked later, against that model
(``gguf_shapes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specdec_core.loading.gguf_header import MAX_ALIGNMENT, Cursor

DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    ggml_type: int
    shape: tuple[int, ...]  # GGUF order: the innermost (row) dimension first
    offset: int  # absolute, in the file
    nbytes: int


def check_tensor_table(cur: Cursor, metadata: dict[str, Any], raw: list[tuple[str, tuple[int, ...], int, int]]
                       ) -> dict[str, TensorInfo]:
    """The table's entries (name, dims, type, offset from the data section) as ``TensorInfo``,
    each checked (see module docstring); ``cur`` stands where the table ends."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(align) is not int or not 0 < align <= MAX_ALIGNMENT or align & (align - 1):
        raise cur.error("general.alignment", f"a power of two up to {MAX_ALIGNMENT}", align)
    start = (cur.pos + align - 1) // align * align
    if not raw:  # no data section (a metadata-only file need not pad to one)
        return {}
    if start > cur.total:
        raise cur.error("data section", f"a start inside the file's {cur.total} bytes", f"byte {start}")
    region = cur.total - start
    tensors: dict[str, TensorInfo] = {}
    for name, dims, ggml_type, offset in raw:
        if name in tensors:
            raise cur.error(name, "each tensor name once in the tensor table", "it again")
        if ggml_type not in GGML_QUANT_SIZES:
            raise cur.error(f"{name} type", "a GGML tensor type the gguf package knows", ggml_type)
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        if min(dims) < 1:
            raise cur.error(f"{name} dimensions", "each at least 1", list(dims))
        if dims[0] % block:
            type_name = GGMLQuantizationType(ggml_type).name
            raise cur.error(f"{name} dimensions", f"rows of whole {type_name} blocks ({block} values each)", list(dims))
        nbytes = math.prod(dims) // block * size
        if offset % align:
            raise cur.error(f"{name} offset", f"a multiple of the alignment {align}", offset)
        if offset + nbytes > region:
            raise cur.error(f"{name} data", f"inside the data section's {region} bytes",
                            f"{nbytes} bytes at offset {offset} (dimensions {list(dims)})")
        tensors[name] = TensorInfo(ggml_type, dims, start + offset, nbytes)
    spans = sorted((info.offset, info.offset + info.nbytes, name) for name, info in tensors.items())
    for (_, end, before), (begin, _, name) in zip(spans, spans[1:]):
        if begin < end:
            raise cur.error(f"{name} data", f"no overlap with {before}, which ends at byte {end}",
                            f"a start at byte {begin}")
    return tensors
