"""``--chat-template``: a model whose tokenizer has no chat template (a GGUF without one in its
metadata, e.g. Gemma 3 270M's) gets one from the command line, as a Jinja string or a file,
through the real server; without it, the ``no_chat_template`` error names the flag."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from server.cli import parse_serve_args, settings_from_args
from server.generation.prompts import render_chat
from server.http.errors import APIError
from tests.helpers.servers import ServerProcess, serving

# Distinct from any real template: the prompt's token count shows it was the one rendered.
TEMPLATE = ("{% for m in messages %}[[{{ m['role'] | upper }}]] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[[ASSISTANT]] {% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
RENDERED = "[[SYSTEM]] Be brief.\n[[USER]] Say hi.\n[[ASSISTANT]] "


@pytest.fixture(scope="module")
def no_template_model(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with its tokenizer's chat template removed (weights linked, not copied)."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("no_template")
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(out)
    for f in tiny_target.iterdir():
        if not (out / f.name).exists() and f.name != "chat_template.jinja":
            (out / f.name).symlink_to(f)
    assert not AutoTokenizer.from_pretrained(out).chat_template
    return out


def args(model: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--speculative-method", "none", "--device", "cpu", "--dtype", "float32",
            "--max-model-len", "256", "--max-num-seqs", "2", "--served-model-name", "m", *extra]


def chat(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": "m", "messages": MESSAGES, "max_tokens": 4, "temperature": 0})


def prompt_tokens(model: Path, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model)(text, add_special_tokens=False).input_ids)


def test_without_a_template_the_error_names_the_flag() -> None:
    class NoTemplate:
        chat_template = None

    with pytest.raises(APIError) as err:
        render_chat(NoTemplate(), MESSAGES, special_tokens_in_content=False)
    assert err.value.code == "no_chat_template" and "--chat-template" in err.value.message


def test_inline_template_serves_chat_for_a_model_without_one(no_template_model: Path, tmp_path: Path) -> None:
    with serving(ServerProcess(args(no_template_model, "--chat-template", TEMPLATE), tmp_path / "inline.log")) as srv:
        answer = chat(srv.url)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == prompt_tokens(no_template_model, RENDERED)
        assert "chat template: from --chat-template" in srv.logs()


def test_template_file_replaces_the_models_own(tiny_target: Path, tmp_path: Path) -> None:
    """From a file, and over a template the tokenizer has (SmolLM2's): the flag's is rendered."""
    path = tmp_path / "turns.jinja"
    path.write_text(TEMPLATE)
    with serving(ServerProcess(args(tiny_target, "--chat-template", str(path)), tmp_path / "file.log")) as srv:
        answer = chat(srv.url)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == prompt_tokens(tiny_target, RENDERED)


@pytest.mark.parametrize("value,why", [("missing/template.jinja", "neither a file nor a Jinja template"),
                                       ("EMPTY", "the template is empty")])
def test_a_value_that_is_neither_a_file_nor_jinja_is_refused_at_start(value: str, why: str, tmp_path: Path) -> None:
    if value == "EMPTY":
        value = str(tmp_path / "empty.jinja")
        Path(value).write_text("")
    with pytest.raises(SystemExit, match=f"--chat-template: .*{why}"):
        settings_from_args(parse_serve_args(["serve", "--chat-template", value], env={}), env={})


def test_a_template_that_loops_is_a_400_naming_it_and_the_server_goes_on(tiny_target: Path, tmp_path: Path) -> None:
    """A template that never ends for some messages (here: a message saying "loop") is stopped at
    --chat-template-timeout: that request is a 400 naming the template, the next renders."""
    path = tmp_path / "loops.jinja"
    path.write_text("{% for m in messages %}{% if m['content'] == 'loop' %}{% for i in range(99999) %}"
                    "{% for j in range(99999) %}{% endfor %}{% endfor %}{% endif %}{% endfor %}" + TEMPLATE)
    with serving(ServerProcess(args(tiny_target, "--chat-template", str(path), "--chat-template-timeout", "1"),
                               tmp_path / "loops.log")) as srv:
        looped = httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
            "model": "m", "messages": [{"role": "user", "content": "loop"}], "max_tokens": 4})
        assert looped.status_code == 400, looped.text
        error = looped.json()["error"]
        assert error["code"] == "chat_template_over_budget" and error["param"] == "messages"
        assert error["message"].startswith(f"The chat template {path} did not finish within 1 s")
        answer = chat(srv.url)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == prompt_tokens(tiny_target, RENDERED)
