"""Real weights where real text matters: SmolLM2-135M-Instruct (GGUF) behind the OpenAI API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_server(smol_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # n-gram speculation over the request's own tokens (no draft model needed), at a fixed k: the
    # adaptive policy weighs step costs timed at start-up, so on a loaded machine it may rightly
    # choose not to speculate, and whether drafts were accepted would depend on the machine's speed.
    srv = ServerProcess(
        ["--model", str(smol_gguf), "--served-model-name", "smol", "--speculative-method", "ngram",
         "--no-adaptive-speculation",
         "--device", "cpu", "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4"],
        tmp_path_factory.mktemp("smol") / "server.log",
    )
    try:
        srv.wait_ready(timeout=600)  # the first load converts the GGUF (cached for the run)
        yield srv
    finally:
        srv.terminate()


@pytest.fixture(scope="module")
def client(smol_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_answers_with_real_text(client: openai.OpenAI) -> None:
    # Not the bare "What is the capital of France?": there SmolLM2's own fp32 model is a near-tie
    # on the first token ("The" 0.152, "L" 0.140), which the file's blocks (the default) tip to "L".
    out = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        max_tokens=24, temperature=0
    )
    assert "Paris" in out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"  # the model ends its turn with its EOS token
    assert out.model_extra["speculative"]["method"] == "ngram"


def test_real_greedy_streamed_and_speculation_off_agree(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "List the days of the week, one per line."}]
    kwargs = dict(model="smol", messages=messages, max_tokens=48, temperature=0)
    spec = client.chat.completions.create(**kwargs)
    plain = client.chat.completions.create(**kwargs, extra_body={"speculative": False})
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True) if c.choices
    )
    text = spec.choices[0].message.content
    assert "Monday" in text
    assert text == plain.choices[0].message.content == streamed
    # Repetitive text is where n-gram lookup pays off: some drafts must have been accepted.
    assert spec.model_extra["speculative"]["accepted_tokens"] > 0
    assert plain.model_extra["speculative"]["method"] == "none"


def test_sdk_parse_gets_a_real_structured_answer(client: openai.OpenAI) -> None:
    """response_format with real weights: the SDK's parse and stream helpers, greedy, agree with
    each other and with speculation off, and the object holds what the prompt said."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        city: str

    kwargs = dict(model="smol", response_format=Person, max_tokens=64, temperature=0,
                  messages=[{"role": "user", "content": "Maria is 34 years old and lives in Lisbon. Give her details as JSON."}])
    out = client.beta.chat.completions.parse(**kwargs)
    person = out.choices[0].message.parsed
    assert isinstance(person, Person) and person.age == 34 and "Lisbon" in person.city, out.choices[0].message.content
    with client.beta.chat.completions.stream(**kwargs) as stream:
        streamed = stream.get_final_completion().choices[0].message
    plain = client.beta.chat.completions.parse(**kwargs, extra_body={"speculative": False}).choices[0].message
    assert streamed.parsed == plain.parsed == person
