"""Stored responses (``store: true`` on ``/v1/responses``), bounded in entries, bytes and age.

A stored response keeps what a later request needs to continue the conversation by its id
(``previous_response_id``): the conversation so far in the internal chat form (instructions left
out, as OpenAI does not carry them over), the response object ``GET /v1/responses/{id}`` returns,
and its input items for ``GET /v1/responses/{id}/input_items``.

The store lives in this process's memory, so it must not grow with traffic: it holds at most
``max_entries`` responses and ``max_bytes`` of them, and forgets an entry ``ttl_s`` seconds after it
was stored. An entry is held as its JSON bytes, parsed again when read: the bytes counted are the
memory held. (Held as parsed objects, 150 responses of 16,000 empty content parts each took ~260 MB
while their JSON counted a tenth of that: a dict per part weighs far more than its text.) Past a bound the least recently used
entries are evicted first (a conversation being continued stays); an entry larger than the whole
byte bound is not stored at all. An evicted, expired or deleted id is simply unknown: a 404.

Ids are chosen by the server with 192 random bits (``server.generation.output_items.new_id``),
so holding one is the capability to read it; the routes sit behind ``--api-key`` like every other.
A deployment with several replicas keeps one store per replica (see docs/api.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from server.http.jsonio import dumps

ENTRY_OVERHEAD = 512  # bytes an entry's objects take beside its JSON (the dataclass, the map's slot)


@dataclass(frozen=True)
class StoredResponse:
    """One stored response, as JSON bytes; each part is parsed when it is read."""

    response_json: bytes  # the response object, as returned
    conversation_json: bytes  # chat-form messages, this response's output included
    input_items_json: bytes  # this request's own input items, with ids
    expires_at: float

    @classmethod
    def pack(cls, response: dict[str, Any], conversation: list[dict[str, Any]], input_items: list[dict[str, Any]],
             expires_at: float) -> "StoredResponse":
        return cls(_exact(response), _exact(conversation), _exact(input_items), expires_at)

    @property
    def size(self) -> int:
        """Bytes counted against the store's bound: what the entry holds."""
        return len(self.response_json) + len(self.conversation_json) + len(self.input_items_json) + ENTRY_OVERHEAD

    @property
    def response(self) -> dict[str, Any]:
        return orjson.loads(self.response_json)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        return orjson.loads(self.conversation_json)

    @property
    def input_items(self) -> list[dict[str, Any]]:
        return orjson.loads(self.input_items_json)


def _exact(value: Any) -> bytes:
    """``value``'s JSON in a bytes object of its own size: orjson's result keeps the buffer it grew
    (a 0.5 MB text held 2.7 MB), which the store would hold for as long as the entry."""
    return bytes(memoryview(dumps(value)))


class ResponseStore:
    """An LRU map of response id -> ``StoredResponse`` within the bounds (see module docstring)."""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, response: dict[str, Any], conversation: list[dict[str, Any]],
            input_items: list[dict[str, Any]]) -> bool:
        """Store a response; False when it alone is larger than the byte bound (not stored)."""
        entry = StoredResponse.pack(response, conversation, input_items, self._clock() + self.ttl_s)
        size = entry.size
        if size > self.max_bytes or self.max_entries == 0:
            return False
        self._drop(response_id)
        self._expire()
        while self._entries and (len(self._entries) >= self.max_entries or self.bytes + size > self.max_bytes):
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evictions += 1
        self._entries[response_id] = entry
        self.bytes += size
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry, or None when unknown, evicted, expired or deleted; a hit is recently used."""
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            self._drop(response_id)
            return None
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self.get(response_id) is not None and self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True

    def _expire(self) -> None:
        """Forget every expired entry (a full pass: use reorders entries, so age is not their order)."""
        now = self._clock()
        expired = [key for key, entry in self._entries.items() if entry.expires_at <= now]
        for key in expired:
            self._drop(key)
