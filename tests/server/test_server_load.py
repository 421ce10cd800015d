"""Load and disconnects on the shared tiny server: queued concurrency, aborts that free the engine."""

from __future__ import annotations

import asyncio

import httpx
import openai

from tests.helpers.servers import TINY_MAX_NUM_SEQS, ServerProcess, metric_value, wait_until

MODEL = "tiny"


def engine_load(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return metric_value(text, "specdec_num_requests_running"), metric_value(text, "specdec_num_requests_waiting")




def test_24_concurrent_streams_all_finish(tiny_server: ServerProcess) -> None:
    """Three times --max-num-seqs: most of them queue, and every one still completes in full."""
    num, max_tokens = 3 * TINY_MAX_NUM_SEQS, 16

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, int]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Request number {i}: say something."}],
            max_tokens=max_tokens,
            temperature=0.7,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, finish, tokens = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return text, finish, tokens

    async def main() -> list[tuple[str, str | None, int]]:
        client = openai.AsyncOpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(num)))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert len(results) == num
    assert all(finish == "length" and tokens == max_tokens for _, finish, tokens in results), results
    wait_until(lambda: engine_load(tiny_server.url) == (0.0, 0.0), 10, "an idle engine")


def test_stream_disconnect_aborts_request(tiny_server: ServerProcess) -> None:
    body = {
        "model": MODEL, "prompt": "Count forever:", "max_tokens": 480, "temperature": 0,
        "ignore_eos": True, "stream": True,
    }
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        received = 0
        for line in lines:
            if line.startswith("data: "):
                received += 1
                if received == 3:
                    break
        running, _ = engine_load(tiny_server.url)
        assert running >= 1, "the request should still be running when the client leaves"
    # Leaving the `with` block closed the connection mid-stream.
    wait_until(lambda: engine_load(tiny_server.url) == (0.0, 0.0), 10, "the aborted request to leave the engine")
    text = httpx.get(tiny_server.url + "/metrics").text
    assert metric_value(text, 'specdec_request_finished_total{finish_reason="abort"}') >= 1


def test_non_streamed_disconnect_aborts_request(tiny_server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": "Count forever:", "max_tokens": 480, "temperature": 0, "ignore_eos": True}
    try:
        httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=0.3)
    except httpx.ReadTimeout:
        pass  # the client gives up and closes its connection
    else:
        raise AssertionError("the request was expected to outlast the client's timeout")
    wait_until(lambda: engine_load(tiny_server.url) == (0.0, 0.0), 10, "the abandoned request to leave the engine")
