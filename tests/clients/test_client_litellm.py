"""LiteLLM against the real server, library and proxy, configured exactly as
docs/using-with-clients.md says.

LiteLLM is not in the test extra: it brings its own pins (1.106 required
``openai<3``, the proxy extra ~100 packages) that would change the environment every other test
runs in. This module builds LiteLLM its own virtual environment instead (``litellm[proxy]`` from
PyPI, installed by uv: seconds, where pip took 90-120 s to resolve and install its ~100 packages
on a 2-core machine with no cache) and runs the library calls there as a
subprocess (tests/helpers/litellm_calls.py); the proxy runs from that environment on a free loopback port
and the suite's own OpenAI SDK talks to it. Every answer is compared with the same request sent to
the server directly (temperature 0 on the shared tiny server: the same tokens), so a client that
drops, mangles or invents anything fails here.

``SPECDEC_LITELLM_PYTHON`` (a Python with ``litellm[proxy]`` installed) skips building the
environment, for working on this file.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from tests.helpers.servers import REPO_ROOT, ServerProcess, free_port, wait_until
from tests.helpers.tool_data import SCHEMAS, TOOLS

# Installs LiteLLM from PyPI: outside the quick `-m "not slow"` subset.
pytestmark = pytest.mark.slow

# 1.106.2 was the first checked by hand; 1.108.8 to 1.110.2 (the newest, 2026-11-24) ask for proxy
# packages PyPI does not have (litellm-enterprise 0.1.79.post2, litellm-proxy), and pip would download
# a dozen 40 MB LiteLLM wheels backtracking to 1.108.7 before installing it.
LITELLM_REQUIREMENT = "litellm[proxy]>=1.106,<=1.108.7"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                         "country": {"enum": ["France", "Peru", "Japan"]}},
        "required": ["name", "country"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": CITY}}
# LiteLLM fetches its model price list from GitHub at import unless told to use its bundled copy;
# nothing here may leave the machine but the pip install.
LITELLM_ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_PROXY": "127.0.0.1,localhost"}


@pytest.fixture(scope="module")
def litellm_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SPECDEC_LITELLM_PYTHON")
    if given:
        return Path(given)
    venv = tmp_path_factory.mktemp("litellm") / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    # --system-certs: the platform's CA store, as pip uses it (uv's own bundle fails behind a TLS proxy)
    install = subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--system-certs", "-p", str(python),
                              LITELLM_REQUIREMENT], capture_output=True, text=True)
    assert install.returncode == 0, f"pip install {LITELLM_REQUIREMENT} failed:\n{install.stdout[-3000:]}{install.stderr[-3000:]}"
    print(f"LiteLLM environment built in {time.monotonic() - started:.0f} s")
    return python


@pytest.fixture(scope="module")
def direct(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def library(litellm_python: Path, tiny_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What ``litellm.completion`` returned for each call of tests/helpers/litellm_calls.py."""
    out = tmp_path_factory.mktemp("litellm_out") / "calls.json"
    args = {"api_base": tiny_server.url + "/v1", "model": "tiny", "messages": MESSAGES, "tools": TOOLS,
            "tool_choice": NAMED, "response_format": RESPONSE_FORMAT}
    run = subprocess.run([str(litellm_python), str(REPO_ROOT / "tests" / "helpers" / "litellm_calls.py"), json.dumps(args), str(out)],
                         capture_output=True, text=True, env=LITELLM_ENV, timeout=600)
    assert run.returncode == 0, f"the LiteLLM calls failed:\n{run.stdout[-3000:]}{run.stderr[-5000:]}"
    return json.loads(out.read_text())


def test_completion_plain_and_streamed_is_the_servers_answer_with_usage(library: dict, direct: openai.OpenAI) -> None:
    reference = direct.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert reference.choices[0].message.content  # a tiny random model still writes 12 tokens of something
    usage = {"prompt_tokens": reference.usage.prompt_tokens, "completion_tokens": 12,
             "total_tokens": reference.usage.prompt_tokens + 12}
    assert library["plain"] == {"content": reference.choices[0].message.content, "finish_reason": "length", "usage": usage}
    assert library["stream"]["content"] == reference.choices[0].message.content
    assert library["stream"]["chunks"] > 2  # streamed, not one chunk at the end
    assert library["stream"]["usage"] == usage
    assert library["stream"]["finish_reason"] == "length"


def test_named_tool_choice_gives_a_parsed_call_and_no_markup(library: dict, direct: openai.OpenAI) -> None:
    reference = direct.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=200, temperature=0,
                                               tools=TOOLS, tool_choice=NAMED).choices[0].message.tool_calls
    tool = library["tool"]
    assert tool["finish_reason"] == "tool_calls"
    assert not tool["content"]  # None (or ""): never the <tool_call> text
    assert [(c["type"], c["name"], c["arguments"]) for c in tool["tool_calls"]] == [
        ("function", "get_weather", reference[0].function.arguments)]
    assert tool["tool_calls"][0]["id"]
    jsonschema.validate(json.loads(tool["tool_calls"][0]["arguments"]), SCHEMAS["get_weather"])


def test_response_format_json_schema_gives_a_valid_object(library: dict, direct: openai.OpenAI) -> None:
    reference = direct.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=200, temperature=0,
                                               response_format=RESPONSE_FORMAT).choices[0].message.content
    assert library["structured"] == {"content": reference, "finish_reason": "stop"}
    jsonschema.validate(json.loads(reference), CITY)


# -- the proxy --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxy(litellm_python: Path, tiny_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory):
    """``litellm --config`` in front of the server on a free loopback port, as the docs configure it."""
    work = tmp_path_factory.mktemp("litellm_proxy")
    config = work / "config.yaml"
    key = "sk-" + secrets.token_hex(32)
    config.write_text(
        "model_list:\n"
        "  - model_name: specdec\n"
        "    litellm_params:\n"
        "      model: openai/tiny\n"
        f"      api_base: {tiny_server.url}/v1\n"
        "      api_key: none\n"
        "general_settings:\n"
        f"  master_key: {key}\n"  # LiteLLM 1.108.7's proxy refuses to start without one
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / "proxy.log", "wb")
    proc = subprocess.Popen([str(litellm_python.parent / "litellm"), "--config", str(config), "--host", "127.0.0.1",
                             "--port", str(port), "--num_workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=LITELLM_ENV, cwd=work)

    def ready() -> bool:
        assert proc.poll() is None, f"the LiteLLM proxy exited with {proc.returncode}:\n{(work / 'proxy.log').read_text()[-5000:]}"
        try:
            return httpx.get(url + "/health/readiness", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, timeout=300, what="the LiteLLM proxy to answer /health/readiness")
        yield openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def test_proxy_passes_chat_streaming_and_usage_through(proxy: openai.OpenAI, direct: openai.OpenAI) -> None:
    assert [m.id for m in proxy.models.list().data] == ["specdec"]
    reference = direct.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    whole = proxy.chat.completions.create(model="specdec", messages=MESSAGES, max_tokens=12, temperature=0)
    assert whole.choices[0].message.content == reference.choices[0].message.content
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (reference.usage.prompt_tokens, 12)
    chunks = list(proxy.chat.completions.create(model="specdec", messages=MESSAGES, max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reference.choices[0].message.content
    assert len(chunks) > 2
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and (usage[-1].prompt_tokens, usage[-1].completion_tokens) == (reference.usage.prompt_tokens, 12)


def test_proxy_passes_a_named_tool_call_and_structured_output_through(proxy: openai.OpenAI, direct: openai.OpenAI) -> None:
    kwargs = dict(messages=MESSAGES, max_tokens=200, temperature=0, tools=TOOLS, tool_choice=NAMED)
    reference = direct.chat.completions.create(model="tiny", **kwargs).choices[0]
    choice = proxy.chat.completions.create(model="specdec", **kwargs).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("get_weather", reference.message.tool_calls[0].function.arguments)]
    streamed: dict[int, str] = {}
    for chunk in proxy.chat.completions.create(model="specdec", stream=True, **kwargs):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed[delta.index] = streamed.get(delta.index, "") + (delta.function.arguments or "")
            assert not chunk.choices[0].delta.content
    assert streamed == {0: reference.message.tool_calls[0].function.arguments}
    structured = proxy.chat.completions.create(model="specdec", messages=MESSAGES, max_tokens=200, temperature=0,
                                               response_format=RESPONSE_FORMAT).choices[0].message.content
    jsonschema.validate(json.loads(structured), CITY)
