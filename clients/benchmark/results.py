"""What one benchmark request measured (a leaf module: the workload fills it, the report reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestResult:
    kind: str
    prompt_index: int
    ok: bool = False
    error: str | None = None
    ttft: float | None = None  # seconds
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with text, from start
    latency: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of the prompt, served from the prefix cache
    completion_tokens: int | None = None
    finish_reason: str | None = None
    speculative: dict | None = None
    text: str = ""
