"""Issue 20, grammar work: tools count toward the prompt-size limit and carry OpenAI's caps, grammar
compiles stay off the event loop (``/health`` answers within 100 ms while seconds of compiles
run), a schema no finite JSON matches is a 400 at compile time, and a schema whose ``$ref`` chain
is deep enough to overflow a default thread stack does not kill the process.

Real ``specdec serve`` subprocesses (tiny models, SmolLM2's tokenizer) on 127.0.0.1; every wait
bounded; the only timing asserted is the ``/health`` budget (``HealthPoller.assert_within_budget``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.raw_http import HealthPoller
from tests.helpers.servers import ServerProcess, serving, tiny_args

C, CHAT = "/v1/completions", "/v1/chat/completions"
WAIT_S = 120.0  # bound on any wait; reached only when something is broken
USER = [{"role": "user", "content": "Call a tool."}]


@pytest.fixture(scope="module")
def roomy(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A tiny server whose prompt-size limit is far above OpenAI's schema caps, so the caps are
    what refuses a large tool definition."""
    with serving(ServerProcess([*tiny_args(tiny_target, tiny_draft), "--max-prompt-chars", "4000000"],
                               tmp_path_factory.mktemp("roomy") / "server.log")) as srv:
        yield srv


def error_of(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """The OpenAI error object ``response`` must carry."""
    assert response.status_code == status, (response.status_code, response.text[:400])
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


def tool(name: str, parameters: dict[str, Any] | None = None, description: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": description}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


# -- tools count toward --max-prompt-chars, with OpenAI's caps ---------------------------------------


def test_tool_definitions_count_toward_the_prompt_size_limit(tiny_server: ServerProcess) -> None:
    """The tiny server takes 64 x 512 = 32,768 characters of prompt. 20,000 characters of message
    alone reach the tokenizer (and are refused for the context, later); with 16,000 characters of
    tool descriptions on top they are refused before anything is tokenized, naming 'tools'."""
    messages = [{"role": "user", "content": "word " * 4000}]
    tools = [tool(f"f{i}", description="d" * 1000) for i in range(16)]
    alone = error_of(httpx.post(tiny_server.url + CHAT, json={"model": "tiny", "messages": messages}, timeout=WAIT_S), 400)
    assert alone["code"] == "context_length_exceeded", alone
    err = error_of(httpx.post(tiny_server.url + CHAT, json={"model": "tiny", "messages": messages, "tools": tools},
                              timeout=WAIT_S), 400, "limit_exceeded")
    assert err["param"] == "tools" and "--max-prompt-chars" in err["message"], err
    assert "messages and tools together" in err["message"], err


def test_the_issue_s_tool_flood_is_refused_before_tokenizing(tiny_server: ServerProcess) -> None:
    """128 tools x 200 properties (about 2.5 MB here) spent 25 s tokenizing before its 400. Its
    104k schema nodes are now refused first by the body's shape (--max-body-containers); without
    that limit, by the tools' characters (--max-prompt-chars)."""
    params = {"type": "object", "properties": {f"property_number_{j}": {"type": "string", "description": "x" * 40}
                                                for j in range(200)}}
    body = {"model": "tiny", "messages": USER, "tools": [tool(f"f{i}", params) for i in range(128)]}
    err = error_of(httpx.post(tiny_server.url + CHAT, json=body, timeout=WAIT_S), 400, "limit_exceeded")
    assert "--max-body-containers" in err["message"], err


def test_more_than_128_tools_is_a_400(roomy: ServerProcess) -> None:
    body = {"model": "tiny", "messages": USER, "tools": [tool(f"f{i}") for i in range(129)]}
    err = error_of(httpx.post(roomy.url + CHAT, json=body, timeout=WAIT_S), 400)
    assert err["param"] == "tools" and "129 tools" in err["message"] and "128" in err["message"], err


@pytest.mark.parametrize(("parameters", "says"), [
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5001)}}, "5001 properties"),
    ({"type": "object", "properties": {"a": {"enum": list(range(1001))}}}, "1001 enum values"),
    ({"type": "object", "description": "x" * 120_001}, "longer than 120000 characters"),
])
def test_each_tool_s_parameters_have_openai_s_schema_caps(roomy: ServerProcess, parameters: dict, says: str) -> None:
    body = {"model": "tiny", "messages": USER, "tools": [tool("ok"), tool("big", parameters)]}
    err = error_of(httpx.post(roomy.url + CHAT, json=body, timeout=WAIT_S), 400)
    assert err["param"] == "tools[1].function.parameters" and says in err["message"], err


# -- a schema no finite JSON matches ------------------------------------------------------------------

UNSATISFIABLE = [
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}},
     "type": "object", "properties": {"head": {"$ref": "#/$defs/node"}}, "required": ["head"]},
]


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


@pytest.mark.parametrize("schema", UNSATISFIABLE)
@pytest.mark.parametrize("path", [C, CHAT])
def test_a_schema_no_finite_json_matches_is_a_400(tiny_server: ServerProcess, schema: dict, path: str) -> None:
    """It used to get 200 with content "" and finish_reason "stop" (llguidance decodes it forever)."""
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "response_format": json_schema(schema)}
    body.update({"prompt": "JSON:"} if path == C else {"messages": USER})
    err = error_of(httpx.post(tiny_server.url + path, json=body, timeout=WAIT_S), 400, "invalid_response_format")
    assert err["param"] == "response_format" and "no finite JSON value" in err["message"], err


def test_recursive_schemas_that_can_end_still_work(tiny_server: ServerProcess) -> None:
    """A linked list whose ``next`` may be null is finite: served, and its output is JSON so far."""
    schema = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {
        "anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
        "type": "object", "properties": {"head": {"$ref": "#/$defs/node"}}, "required": ["head"]}
    out = httpx.post(tiny_server.url + C, json={"model": "tiny", "prompt": "JSON:", "max_tokens": 4,
                                                "response_format": json_schema(schema)}, timeout=WAIT_S)
    assert out.status_code == 200, out.text[:300]
    assert out.json()["choices"][0]["text"].lstrip().startswith("{")


# -- grammar compiles: off the loop, and on a stack deep enough ------------------------------------


def ring_schema(n: int) -> dict:
    """``n`` ``$defs`` that refer to each other in a ring (finite: no property is required);
    llguidance recurses through the whole ring while it compiles."""
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}},
            "$defs": {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{(i + 1) % n}"},
                                                                   "y": {"type": "integer"}}} for i in range(n)}}


def test_a_deep_ref_ring_within_the_caps_does_not_kill_the_server(tiny_server: ServerProcess) -> None:
    """1,100 ``$defs`` (111 KB, under the 120,000-character cap) overflowed the compile thread's
    8 MB stack: SIGSEGV, the whole process gone. The grammar pool's workers have a large stack."""
    body = {"model": "tiny", "prompt": "JSON:", "max_tokens": 2, "response_format": json_schema(ring_schema(1100))}
    out = httpx.post(tiny_server.url + C, json=body, timeout=WAIT_S)
    assert out.status_code == 200, out.text[:300]
    assert tiny_server.proc.poll() is None
    assert httpx.get(tiny_server.url + "/health", timeout=10).status_code == 200


def wide_schema(tag: str) -> dict:
    """About 105 KB: 1,500 required string properties with patterns (about 0.12 s to compile on the
    2-core dev machine; each ``tag`` is a different schema, so nothing comes from the cache)."""
    names = [f"{tag}_{i}" for i in range(1500)]
    return {"type": "object", "properties": {n: {"type": "string", "pattern": "^[a-z]{1,8}$"} for n in names},
            "required": names}


def test_health_answers_within_100_ms_while_seconds_of_grammars_compile(tiny_server: ServerProcess) -> None:
    """Ten waves of five concurrent requests (one compiling, four queued: the pool's bound), each
    with its own cap-sized schema: 50 compiles, about 6 s of llguidance work that on the event loop
    would have held /health for all of it. Every request is served; /health keeps its budget."""
    statuses: list[int] = []
    lock = threading.Lock()

    def send(tag: str) -> None:
        body = {"model": "tiny", "prompt": "JSON:", "max_tokens": 1, "response_format": json_schema(wide_schema(tag))}
        status = httpx.post(tiny_server.url + C, json=body, timeout=WAIT_S).status_code
        with lock:
            statuses.append(status)

    with HealthPoller(tiny_server.port) as poller:
        for wave in range(10):
            threads = [threading.Thread(target=send, args=(f"w{wave}c{i}",)) for i in range(5)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT_S)
    assert statuses == [200] * 50, statuses
    assert poller.statuses and set(poller.statuses) == {200}, set(poller.statuses)
    poller.assert_within_budget()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "loop"}}])
def test_a_forced_tool_call_no_finite_json_matches_is_a_400(tiny_server: ServerProcess, choice: Any) -> None:
    """A forced call under parameters no finite JSON matches would be decoded until max_tokens."""
    tools = [{"type": "function", "function": {"name": "loop", "parameters": UNSATISFIABLE[0]}}]
    body = {"model": "tiny", "max_tokens": 8, "messages": USER, "tools": tools, "tool_choice": choice}
    err = error_of(httpx.post(tiny_server.url + CHAT, json=body, timeout=WAIT_S), 400, "invalid_value")
    assert err["param"] == "tool_choice" and "no finite JSON value" in err["message"], err
