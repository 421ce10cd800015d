"""The stored-responses map behind ``/v1/responses`` (``server.services.response_store``): it never
holds more than its entries and bytes, evicts the least recently used first, forgets entries at
their age, and refuses one entry larger than the whole byte bound. Time is the store's own clock
argument, advanced by hand, so expiry is tested without waiting."""

from __future__ import annotations

import gc
import tracemalloc

from server.services.response_store import ResponseStore, StoredResponse


def entry(i: int, chars: int = 10) -> tuple[dict, list[dict], list[dict]]:
    return {"id": f"resp_{i}", "text": "x" * chars}, [{"role": "user", "content": "hi"}], [{"id": f"msg_{i}"}]


def test_entries_bound_evicts_the_least_recently_used() -> None:
    store = ResponseStore(max_entries=3, max_bytes=10**6, ttl_s=60)
    for i in range(3):
        assert store.put(f"r{i}", *entry(i))
    assert store.get("r0") is not None  # r0 used: r1 is now the least recently used
    for i in range(3, 6):
        store.put(f"r{i}", *entry(i))
        assert len(store) <= 3
    assert [key for key in ("r0", "r1", "r2", "r3", "r4", "r5") if store.get(key)] == ["r3", "r4", "r5"]
    assert store.evictions == 3


def test_bytes_bound_holds_and_an_oversized_entry_is_not_stored() -> None:
    size = StoredResponse.pack(*entry(0, chars=1000), expires_at=0).size
    store = ResponseStore(max_entries=100, max_bytes=size * 2 + size // 2, ttl_s=60)
    for i in range(5):
        assert store.put(f"r{i}", *entry(i, chars=1000))
        assert store.bytes <= store.max_bytes and store.bytes == sum(e.size for e in store._entries.values())
    assert len(store) == 2 and store.get("r3") and store.get("r4")
    assert not store.put("huge", *entry(9, chars=10 * size)) and store.get("huge") is None and len(store) == 2


def test_entries_expire_and_deleted_ones_are_gone() -> None:
    now = [1000.0]
    store = ResponseStore(max_entries=10, max_bytes=10**6, ttl_s=30, clock=lambda: now[0])
    store.put("old", *entry(0))
    now[0] += 20
    store.put("new", *entry(1))
    now[0] += 15  # "old" is 35 s old, "new" 15 s
    assert store.get("old") is None and store.get("new") is not None
    assert store.delete("new") and not store.delete("new") and store.get("new") is None
    assert len(store) == 0 and store.bytes == 0


def test_what_the_store_holds_in_memory_is_what_it_counts() -> None:
    """Filled with responses of many empty parts (whose parsed objects weigh ten times their JSON),
    the memory the store holds stays within its byte bound; each read parses a fresh copy."""
    parts = [{"type": "input_text", "text": ""} for _ in range(16_000)]
    store = ResponseStore(max_entries=1000, max_bytes=8 * 1024 * 1024, ttl_s=60)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(40):
            store.put(f"r{i}", {"id": f"r{i}"}, [{"role": "user", "content": parts}], [{"id": f"m{i}", "content": parts}])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.evictions > 0 and store.bytes <= store.max_bytes
    assert held <= store.max_bytes * 1.2, f"the store holds {held} bytes for a bound of {store.max_bytes}"
    newest = store.get("r39")
    assert newest is not None and newest.conversation[0]["content"] == parts
    assert newest.conversation is not newest.conversation  # parsed on each read, never kept
