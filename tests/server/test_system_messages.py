"""System messages after the first turn (Claude Code's environment and reminders, Codex's developer
messages) with a real tokenizer and two kinds of chat template: one that renders them where they
stand (SmolLM2's), one that takes a leading system message only and raises on any other (the
Gemma instruct templates' rule, written here). And Claude Code's billing header, left out of the
prompt so that the prefix cache sees the same start every request."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from server.anthropic.schemas import MessagesPrompt
from server.anthropic.translate import chat_messages
from server.generation.prompts import later_system_messages_render, leading_system

# Roles must alternate user/model; a leading system message is folded into the first user turn.
ALTERNATING = (
    "{% set first = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == 'system' else '' %}"
    "{% set turns = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% for m in turns %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{{ (first if loop.first else '') + m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
CONVERSATION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "system", "content": "The cwd is /work."},
                {"role": "user", "content": "where am I?"}]


@pytest.fixture(scope="module")
def tokenizers(smol_tokenizer_dir: Path):
    smol = AutoTokenizer.from_pretrained(smol_tokenizer_dir)
    alternating = copy.deepcopy(smol)
    alternating.chat_template = ALTERNATING
    return smol, alternating


def test_later_system_messages_stay_where_the_template_renders_them(tokenizers) -> None:
    smol, alternating = tokenizers
    assert later_system_messages_render(smol) and not later_system_messages_render(alternating)
    text = smol.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text.index("hi") < text.index("The cwd is /work.") < text.index("where am I?")
    with pytest.raises(Exception, match="alternate"):
        alternating.apply_chat_template(CONVERSATION, tokenize=False)
    merged = leading_system(CONVERSATION)
    assert merged == [{"role": "system", "content": "You are terse.\n\nThe cwd is /work."}, *CONVERSATION[1:3],
                      CONVERSATION[4]]
    text = alternating.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)
    assert text.index("The cwd is /work.") < text.index("hi") < text.index("where am I?")
    assert leading_system(merged) == merged and leading_system(CONVERSATION[1:3]) == CONVERSATION[1:3]


def test_billing_header_is_left_out_and_system_messages_kept_in_order() -> None:
    def body(cch: str) -> MessagesPrompt:
        return MessagesPrompt.model_validate({"model": "m", "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.328.59d; cc_entrypoint=cli; cch={cch};"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}]})

    first, second = chat_messages(body("fa690")), chat_messages(body("0b1c2"))
    assert first == second == [{"role": "system", "content": "You are Claude Code."}, {"role": "user", "content": "hi"},
                               {"role": "system", "content": "# Environment"}]
