"""A request body's JSON shape, counted on the raw bytes before anything parses it.

Parsing holds the GIL for the whole body: pydantic turns every array, object and value into Python
objects in one native call, and the event loop (``/health`` included) waits meanwhile. Within the
8 MiB body limit that was seconds: 8 MB of ``[[],[],...]`` in an unknown field held it 4.8 s,
``{"k1":0,...}`` 1.1 s, 4M integers 0.5 s (2-core dev machine, loaded). Containers and object keys
cost about 1 us each (each one is an object the cyclic GC tracks), other values about 0.1 us. So a
body is refused by its shape first: at most ``--max-body-containers`` arrays, objects and object
keys, and ``--max-body-values`` values (counted as the commas between them), both outside strings.

The count itself must not hold the GIL long either: it runs in chunks (``bytes`` methods, C speed,
a few milliseconds each) and yields the GIL between them. Escaped quotes and backslashes are
removed first, so every remaining ``"`` opens or closes a string and the parity of the quotes seen
says whether a chunk starts inside one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

CHUNK_BYTES = 256 * 1024  # even: see _chunk_end


@dataclass(frozen=True)
class JsonShape:
    containers: int  # arrays, objects and object keys
    values: int  # separators between values and members: about how many values there are


def json_shape(raw: bytes) -> JsonShape:
    """Counted outside strings, for any bytes (invalid JSON is counted too, and refused later by
    the parser). Call it off the event loop: it yields the GIL between chunks, not before."""
    containers = values = 0
    inside = False  # whether the current chunk starts inside a string
    start = 0
    while start < len(raw):
        end = _chunk_end(raw, start)
        chunk = raw[start:end].replace(b"\\\\", b"").replace(b'\\"', b"")
        pieces = chunk.split(b'"')
        outside = b"".join(pieces[1 if inside else 0::2])
        containers += outside.count(b"[") + outside.count(b"{") + outside.count(b":")
        values += outside.count(b",")
        inside = inside != (len(pieces) % 2 == 0)
        start = end
        time.sleep(0)  # let the event loop take the GIL between chunks
    return JsonShape(containers, values)


def _chunk_end(raw: bytes, start: int) -> int:
    """Where the chunk from ``start`` ends: never inside a run of backslashes, so no escape is cut
    in two (a chunk starts at the start of a run, so a chunk that is all backslashes is whole
    pairs when its length is even)."""
    end = min(start + CHUNK_BYTES, len(raw))
    if end == len(raw):
        return end
    cut = start + len(raw[start:end].rstrip(b"\\"))
    return cut if cut > start else end
