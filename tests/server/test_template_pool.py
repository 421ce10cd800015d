"""Chat templates are code from a model file: each render runs in the template pool under a time
and an output budget, and a template that never ends holds none of the threads other requests
use (``server.services.template_pool``; through the real server: ``test_chat_template_flag.py``)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from server.http.errors import APIError
from server.services.template_pool import TemplatePool, budget_template_output

# Ten billion iterations of nothing: no output, so only the time budget can stop it.
LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}"
# A million characters per message: only the output budget stops it early.
BLOATS = "{% for i in range(99999) %}{{ 'xxxxxxxxxx' }}{% endfor %}{{ messages[0]['content'] }}"
NORMAL = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
MESSAGES = [{"role": "user", "content": "hi"}]


def forever() -> None:
    while True:
        pass


@pytest.fixture()
def tokenizer(smol_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_tokenizer_dir)


def render(tokenizer, template: str) -> str:
    tokenizer.chat_template = template
    budget_template_output(tokenizer)
    return tokenizer.apply_chat_template(MESSAGES, tokenize=False)


def test_a_render_past_its_time_is_stopped_and_the_worker_serves_the_next() -> None:
    pool = TemplatePool(seconds=0.2, max_chars=1000, workers=1)

    async def main() -> None:
        with pytest.raises(APIError) as err:
            await pool.run("The model's chat template", forever)
        assert err.value.status == 400 and err.value.code == "chat_template_over_budget"
        assert err.value.message.startswith("The model's chat template did not finish within 0.2 s")
        assert await pool.run("t", lambda: 42) == 42  # the one worker is free again

    asyncio.run(main())
    pool.shutdown()


def test_a_jinja_template_that_loops_is_stopped(tokenizer) -> None:
    pool = TemplatePool(seconds=0.5, max_chars=10**6)

    async def main() -> None:
        with pytest.raises(APIError, match="did not finish"):
            await pool.run("t", render, tokenizer, LOOPS)
        assert await pool.run("t", render, tokenizer, NORMAL) == "<user>hi"

    asyncio.run(main())
    pool.shutdown()


def test_a_template_that_writes_too_much_is_stopped(tokenizer) -> None:
    pool = TemplatePool(seconds=600, max_chars=100_000)

    async def main() -> None:
        with pytest.raises(APIError, match="wrote more than 100000 characters") as err:
            await pool.run("The chat template t.jinja", render, tokenizer, BLOATS)
        assert err.value.code == "chat_template_over_budget"
        assert await pool.run("t", render, tokenizer, NORMAL) == "<user>hi"

    asyncio.run(main())
    pool.shutdown()
    assert render(tokenizer, BLOATS).endswith("hi")  # outside the pool no budget applies


def test_renders_that_hold_every_worker_hold_nothing_else() -> None:
    """Requests that render no template (validation, tokenization: the default pool) go on while
    every template worker is busy, and a render beyond the queue bound is a 503, not a wait."""
    pool = TemplatePool(seconds=600, max_chars=1000, workers=2, queue=1)
    started = threading.Semaphore(0)
    release = threading.Event()

    def busy() -> str:
        started.release()
        release.wait()
        return "done"

    async def main() -> None:
        held = [asyncio.ensure_future(pool.run("t", busy)) for _ in range(3)]
        for _ in range(2):
            await asyncio.to_thread(started.acquire)  # both workers are inside a render
        assert await asyncio.to_thread(lambda: "unrelated") == "unrelated"
        with pytest.raises(APIError) as err:
            await pool.run("t", busy)
        assert err.value.status == 503 and err.value.code == "template_queue_full"
        assert not any(h.done() for h in held)
        release.set()
        assert await asyncio.gather(*held) == ["done"] * 3

    asyncio.run(main())
    pool.shutdown()
