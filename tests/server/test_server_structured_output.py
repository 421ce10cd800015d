"""``response_format`` through a real ``specdec serve`` (tiny random models, auto speculation) and
the OpenAI SDK's own structured-output helpers, streamed and not, on both endpoints."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.helpers.servers import ServerProcess

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Describe the weather as JSON."}]


class Weather(BaseModel):
    """Finite by construction, so even a random model completes it."""

    sky: Literal["clear", "cloudy", "rain"]
    windy: bool
    warnings: list[Literal["heat", "storm", "fog"]] = Field(max_length=2)


@pytest.fixture(scope="module")
def client(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_sdk_parse_returns_the_pydantic_model(client: openai.OpenAI) -> None:
    for seed in range(3):
        out = client.beta.chat.completions.parse(
            model=MODEL, messages=MESSAGES, response_format=Weather, max_tokens=200, temperature=1.0, seed=seed
        )
        choice = out.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Weather)
        assert out.speculative["method"] != "none"  # type: ignore[attr-defined]


def test_sdk_stream_helper_assembles_the_parsed_model(client: openai.OpenAI) -> None:
    with client.beta.chat.completions.stream(
        model=MODEL, messages=MESSAGES, response_format=Weather, max_tokens=200, temperature=0.0
    ) as stream:
        pieces = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(pieces) > 1  # it streamed
    parsed = final.choices[0].message.parsed
    assert isinstance(parsed, Weather)
    # greedy: the same object as not streamed, and as with speculation off
    alone = client.beta.chat.completions.parse(model=MODEL, messages=MESSAGES, response_format=Weather,
                                               max_tokens=200, temperature=0.0)
    plain = client.beta.chat.completions.parse(model=MODEL, messages=MESSAGES, response_format=Weather,
                                               max_tokens=200, temperature=0.0, extra_body={"speculative": False})
    assert alone.choices[0].message.content == plain.choices[0].message.content == "".join(pieces)


def test_completions_take_response_format_too(client: openai.OpenAI) -> None:
    schema = {**Weather.model_json_schema(), "additionalProperties": False}  # else any extra key may follow
    out = client.completions.create(
        model=MODEL, prompt="Weather report in JSON:", max_tokens=200, temperature=0.7, n=3, seed=1,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}},
    )
    for choice in out.choices:
        assert choice.finish_reason == "stop", choice.text
        jsonschema.validate(json.loads(choice.text), schema)


def test_json_object_starts_an_object(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0.0,
                                         response_format={"type": "json_object"})
    assert out.choices[0].message.content.lstrip().startswith("{")


def test_an_uncompilable_schema_is_a_400_that_says_why(client: openai.OpenAI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strang"}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, response_format=bad)  # type: ignore[arg-type]
    body = err.value.body
    assert body["param"] == "response_format" and "strang" in body["message"]  # type: ignore[index]
