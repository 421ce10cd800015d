"""LangChain's ``ChatOpenAI`` (langchain-openai) against the real server, configured exactly as
docs/using-with-clients.md says: only ``base_url``, ``api_key`` and the served model name.

LiteLLM is not in the test extra (its pins would change the SDK every other test uses):
tests/clients/test_client_litellm.py installs it into a virtual environment of its own."""

from __future__ import annotations

import langchain_openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.helpers.servers import ServerProcess


class City(BaseModel):
    """A city and its country."""

    # Closed (additionalProperties: false): with extra keys allowed, the grammar lets a tiny random
    # model go on adding members, and whether it closes the object within max_tokens is chance.
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=12)
    country: str = Field(max_length=12)


# A bounded argument: a tiny random model writes whatever a string allows, and the call must end
# well inside max_tokens for LangChain to parse it.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def chat(tiny_server: ServerProcess):
    return langchain_openai.ChatOpenAI(base_url=tiny_server.url + "/v1", api_key="unused", model="tiny",
                                       temperature=0, max_tokens=12, max_retries=0, timeout=120)


def test_invoke_and_stream_give_the_same_text_and_usage(chat) -> None:
    message = chat.invoke("Say hello.")
    assert isinstance(message.content, str) and message.content
    assert message.usage_metadata["output_tokens"] == 12
    chunks = list(chat.stream("Say hello.", stream_usage=True))
    assert "".join(c.content for c in chunks) == message.content
    assert sum((c.usage_metadata or {}).get("output_tokens", 0) for c in chunks) == 12


def test_bound_tools_with_a_named_choice_call_it_whole_and_streamed(chat) -> None:
    bound = chat.bind_tools([WEATHER], tool_choice="get_weather").bind(max_tokens=200)
    message = bound.invoke("What is the weather in Paris?")
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0]["args"]["city"], str)
    assert "<tool_call>" not in message.content
    streamed = None
    for chunk in bound.stream("What is the weather in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(c["name"], c["args"]) for c in message.tool_calls]


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_structured_output_in_each_of_its_methods(chat, method: str) -> None:
    roomy = chat.model_copy(update={"max_tokens": 300})  # room for the call markup around the object
    structured = roomy.with_structured_output(City, method=method, include_raw=True)
    prompt = "Name a city and its country as JSON with keys name and country."
    if method == "json_mode":
        # json_mode constrains to *some* JSON object; the keys come from the prompt, which a tiny
        # random model does not follow: parse the raw object instead of validating it.
        raw = roomy.with_structured_output(None, method="json_mode").invoke(prompt)
        assert isinstance(raw, dict)
        return
    out = structured.invoke(prompt)
    assert isinstance(out["parsed"], City), (out["raw"], out["parsing_error"])


def test_a_call_cut_by_max_tokens_is_an_invalid_tool_call_never_content(chat) -> None:
    message = chat.bind_tools([WEATHER], tool_choice="get_weather").bind(max_tokens=25).invoke("Weather in Paris?")
    assert message.content == ""
    assert message.response_metadata["finish_reason"] == "length"
    assert [c["name"] for c in message.invalid_tool_calls + message.tool_calls] == ["get_weather"]
