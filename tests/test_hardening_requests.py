"""Issue 20, requests: odd sampling values behave, admission is released when clients leave and
agrees with /metrics, and structured output is bounded and off the event loop. Real servers,
127.0.0.1 only; every wait bounded."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import ServerProcess

C = "/v1/completions"
P = {"model": "tiny", "prompt": "The weather today", "max_tokens": 12, "ignore_eos": True}


@pytest.mark.parametrize("temperature", [1e-38, 1e-30, 9e-6])
def test_a_tiny_temperature_is_greedy(tiny_server: ServerProcess, temperature: float) -> None:
    """T < 1e-5 is greedy (vLLM's rule); 1e-38 divided the logits into inf and sampled from NaN."""
    greedy = httpx.post(tiny_server.url + C, json={**P, "temperature": 0}, timeout=60)
    tiny = httpx.post(tiny_server.url + C, json={**P, "temperature": temperature, "seed": 7}, timeout=60)
    assert greedy.status_code == tiny.status_code == 200, (greedy.text, tiny.text)
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
