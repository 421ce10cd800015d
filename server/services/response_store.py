"""Stored responses (``store: true`` on ``/v1/responses``), bounded in entries, bytes and age.

A stored response keeps what a later request needs to continue the conversation by its id
(``previous_response_id``): the conversation so far in the internal chat form (instructions left
out, as OpenAI does not carry them over), the response object ``GET /v1/responses/{id}`` returns,
and its input items for ``GET /v1/responses/{id}/input_items``.

The store lives in this process's memory, so it must not grow with traffic: it holds at most
``max_entries`` responses and ``max_bytes`` of them (each entry's size is that of its JSON), and
forgets an entry ``ttl_s`` seconds after it was stored. Past a bound the least recently used
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

from server.http.jsonio import dumps_str


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object, as returned
    conversation: list[dict[str, Any]]  # chat-form messages, this response's output included
    input_items: list[dict[str, Any]]  # this request's own input items, with ids
    size: int  # bytes counted against the store's bound
    expires_at: float

    @staticmethod
    def measure(response: dict[str, Any], conversation: list[dict[str, Any]], input_items: list[dict[str, Any]]) -> int:
        return len(dumps_str([response, conversation, input_items]).encode())


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
        size = StoredResponse.measure(response, conversation, input_items)
        if size > self.max_bytes or self.max_entries == 0:
            return False
        self._drop(response_id)
        self._expire()
        while self._entries and (len(self._entries) >= self.max_entries or self.bytes + size > self.max_bytes):
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evictions += 1
        self._entries[response_id] = StoredResponse(response, conversation, input_items, size, self._clock() + self.ttl_s)
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
