"""The GGUF reader under mutated headers (issue 64): whatever a stranger's file holds, reading it
either gives a valid parse or raises ``ModelFileError``, nothing else (no MemoryError,
RecursionError, OverflowError, struct.error, IndexError...), and allocates no more than the
file's size plus a fixed bound.

The seed is a small valid file using every kind of field (``gguf_raw.small_model_file``: scalars
of each type, strings, arrays of numbers, strings and arrays, three tensor types), written field
by field so the fuzzer knows where each count, length, type, dimension and offset is. Each
example applies a few mutations: a field set to a boundary value (0, 1, 2^31, 2^32-1, 2^40,
2^64-1...) or nudged by a few, a header byte changed, bytes spliced into or cut from the header,
the file cut short. A valid parse must also read every tensor it names from inside the file.

Reproducible and machine-independent: derandomized (the same examples on every run), no example
database, no deadline; the allocation bound is tracemalloc's peak, which does not depend on the
machine. 1,000 examples: 3-5 s on the shared 2-core dev machine.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_core.loading.gguf_file import read_gguf
from specdec_core.loading.model_errors import ModelFileError
from tests.helpers.gguf_raw import small_model_file

SEED, FIELDS = small_model_file()
HEADER_END = 1312  # where the seed's data section starts (its first tensor's offset)
# What a parse may allocate beyond the file's own size: its Python objects (a few hundred keys
# or tensors at most in a file this small). A claimed count or length that were trusted would
# allocate gigabytes.
BOUND = 1 << 20
BOUNDARIES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 31, 32, 33, 64, 255, 256, 4096, 1 << 16, 1 << 24,
              2**31 - 1, 2**31, 2**32 - 1, 2**32, 1 << 40, 2**63 - 1, 2**63, 2**64 - 1]

field_set = st.tuples(st.just("set"), st.integers(0, len(FIELDS) - 1),
                      st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, 2**64 - 1)))
field_nudge = st.tuples(st.just("nudge"), st.integers(0, len(FIELDS) - 1), st.integers(-3, 3))
byte_set = st.tuples(st.just("byte"), st.integers(0, HEADER_END - 1), st.integers(0, 255))
splice = st.tuples(st.just("splice"), st.integers(0, HEADER_END), st.binary(max_size=12), st.integers(0, 12))
cut = st.tuples(st.just("cut"), st.integers(0, len(SEED)))
mutations = st.lists(st.one_of(field_set, field_nudge, byte_set, splice, cut), min_size=1, max_size=4)


def mutated(steps: list[tuple]) -> bytes:
    """The seed with ``steps`` applied in order (field positions are the seed's; a step that an
    earlier splice or cut moved or removed changes whatever is there now)."""
    data = bytearray(SEED)
    for step in steps:
        kind = step[0]
        if kind in ("set", "nudge"):
            where = FIELDS[step[1]]
            if where.offset + where.size > len(data):
                continue
            old = int.from_bytes(data[where.offset:where.offset + where.size], "little")
            value = step[2] if kind == "set" else old + step[2]
            data[where.offset:where.offset + where.size] = (value % (1 << 8 * where.size)).to_bytes(where.size, "little")
        elif kind == "byte" and step[1] < len(data):
            data[step[1]] = step[2]
        elif kind == "splice":
            data[step[1]:step[1] + step[3]] = step[2]
        elif kind == "cut":
            del data[step[1]:]
    return bytes(data)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file each example is written to, after one read of the seed: the reader imports the
    gguf package on first use, which must not count as an example's allocation."""
    path = tmp_path_factory.mktemp("fuzz") / "mutated.gguf"
    path.write_bytes(SEED)
    read_gguf(path)
    return path


def test_the_seed_is_valid(scratch: Path):
    scratch.write_bytes(SEED)
    file = read_gguf(scratch)
    assert min(info.offset for info in file.tensors.values()) == HEADER_END
    assert {f.role for f in FIELDS} == {"version", "count", "length", "type", "value", "ndims", "dim", "offset"}


@settings(max_examples=1000, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps=mutations)
def test_a_mutated_header_parses_or_is_one_model_file_error(scratch: Path, steps: list[tuple]):
    data = mutated(steps)
    scratch.write_bytes(data)
    tracemalloc.start()
    try:
        try:
            file = read_gguf(scratch)
            spans = sorted((info.offset, info.offset + info.nbytes) for info in file.tensors.values())
            for name in file.tensors:
                file.read(name)
        except ModelFileError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("mutated.gguf: ")
            spans = []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert all(end <= begin for (_, end), (begin, _) in zip(spans, spans[1:]))  # no tensor overlaps another
    assert all(end <= len(data) for _, end in spans)
    assert peak <= len(data) + BOUND, f"{peak} bytes for a {len(data)}-byte file"
