"""Prompts to token ids, and the context-length check, before anything reaches the engine.

The server tokenizes itself (rather than handing text to the engine) so it knows each prompt's
length up front: a request that cannot fit in ``max_model_len`` is refused with OpenAI's
"maximum context length" 400 instead of failing later inside the engine.

Tokenizing and rendering a chat template take time that grows with the prompt, so the routes run
them off the event loop: ``tokenize_prompts`` on the default pool (``asyncio.to_thread``; the
tokenizer releases the GIL while it encodes), ``render_chat`` in the template pool, under a time
and output budget (a template is code from a model file: ``server.services.template_pool``). Prompt sizes are bounded before this
(``--max-prompt-chars``, see ``server.api.limits``).
"""

from __future__ import annotations

from typing import Any

from server.http.errors import invalid_request
from specdec_core.decoding.sampling_params import outside_vocab


def tokenize_prompts(tokenizer: Any, prompts: list[str | list[int]], vocab_size: int) -> list[list[int]]:
    """Token ids of every prompt of a completions request, in order (the first bad one is a 400)."""
    return [tokenize_prompt(tokenizer, p, vocab_size) for p in prompts]


def tokenize_prompt(tokenizer: Any, prompt: str | list[int], vocab_size: int, param: str = "prompt") -> list[int]:
    """Token ids of a completions prompt (text gets the tokenizer's usual special tokens)."""
    if isinstance(prompt, str):
        ids = list(tokenizer(prompt)["input_ids"])
    else:
        ids = list(prompt)
        bad = outside_vocab(vocab_size, {param: ids})
        if bad is not None:
            raise invalid_request(
                f"Token id {bad[1]} in '{param}' is outside the vocabulary (valid ids: 0 <= id < {vocab_size}).",
                param,
                code="invalid_token_id",
            )
    if not ids:
        raise invalid_request(f"'{param}' must not be empty.", param)
    return ids


# A probe conversation with a system message after the first turn; the markers are what to look for.
_PROBE_ANSWER, _PROBE_SYSTEM = "specdec-probe-answer", "specdec-probe-later-system"
_PROBE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
          {"role": "assistant", "content": _PROBE_ANSWER}, {"role": "system", "content": _PROBE_SYSTEM},
          {"role": "user", "content": "v"}]
_later_system_renders: dict[str, bool] = {}  # by template text: a server has one or two templates


def later_system_messages_render(tokenizer: Any) -> bool:
    """Whether the chat template renders a system message after the first turn where it stands
    (Qwen2.5's, Llama 3's, SmolLM2's do; Gemma's raises on it, others drop it). Found once per
    template by rendering a probe conversation."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return True
    known = _later_system_renders.get(template)
    if known is None:
        try:
            text = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
        except Exception:  # jinja2 TemplateError / raise_exception(): it does not take one there
            text = ""
        known = isinstance(text, str) and _PROBE_SYSTEM in text.partition(_PROBE_ANSWER)[2]
        _later_system_renders[template] = known
    return known


def leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with every system message's text joined, in order, into one system message
    in front: for a template that takes only a leading one (Claude Code's and Codex's later system
    and developer messages would otherwise be a 400)."""
    systems = [m["content"] for m in messages if m["role"] == "system"]
    if not systems or (len(systems) == 1 and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": "\n\n".join(systems)}, *(m for m in messages if m["role"] != "system")]


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], *, special_tokens_in_content: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of the chat template applied to ``messages``, ready for the assistant's reply.

    Tools reach the prompt through ``messages`` and ``template_kwargs`` as the request's
    ``server.tools.ToolUse.prompt_messages`` made them.

    The rendered text already contains the template's special tokens, so it is encoded without
    adding more (a second BOS would change what the model sees). Special-token text inside the
    messages (``hi<|im_end|><|im_start|>system``) is encoded as the plain text it is, unless
    ``special_tokens_in_content``: otherwise a message could forge turns and roles. Only the
    template's own control tokens become control tokens (transformers' ``sanitize_control_tokens``:
    the tokenizer's special tokens and the added tokens the template writes).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise invalid_request(
            "This model has no chat template: start the server with --chat-template (a Jinja file or string), "
            "or use /v1/completions with a plain prompt.", "messages", code="no_chat_template"
        )
    try:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False,
            sanitize_control_tokens=not special_tokens_in_content, **(template_kwargs or {}),
        )
    except Exception as exc:  # jinja2 TemplateError / raise_exception() inside the template
        raise invalid_request(f"The model's chat template rejected these messages: {exc}", "messages") from None
    if not ids:
        raise invalid_request("The rendered conversation is empty.", "messages")
    return list(ids)


def resolve_max_tokens(
    prompt_len: int, requested: int | None, max_model_len: int, *, prompt_param: str, tokens_param: str,
    up_to_context: bool = False,
) -> int:
    """The completion budget: ``requested``, or all the room left; 400 when it cannot fit.
    ``up_to_context``: a ``requested`` beyond the room left is a cap the context lowers, not an
    error (Anthropic's ``max_tokens``: the answer then ends with ``model_context_window_exceeded``)."""
    if prompt_len >= max_model_len:
        raise invalid_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your {prompt_param} "
            f"has {prompt_len} tokens, which leaves no room for a completion. Please shorten the {prompt_param}.",
            prompt_param,
            code="context_length_exceeded",
        )
    if requested is None or (up_to_context and prompt_len + requested > max_model_len):
        return max_model_len - prompt_len
    if prompt_len + requested > max_model_len:
        raise invalid_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the {prompt_param}, {requested} in the completion). "
            f"Please reduce the length of the {prompt_param} or of '{tokens_param}'.",
            tokens_param,
            code="context_length_exceeded",
        )
    return requested
