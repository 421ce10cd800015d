"""``prompt_logprobs``, ``echo`` + ``logprobs`` and ``logprobs_mode`` through the real server and the
OpenAI SDK (vLLM's fields through ``extra_body``): the values are the tiny model's own
log-softmax, the first prompt token's entry is null, and the validation errors are 400s."""

from __future__ import annotations

import math

import openai
import pytest
import torch

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
CHUNK = "8"  # several prefill chunks, and full chunks the prefix cache can serve


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    from tests.helpers.servers import ServerProcess, serving, tiny_args

    args = [*tiny_args(tiny_target, tiny_draft), "--quantize", "none", "--prefill-chunk-size", CHUNK]
    with serving(ServerProcess(args, tmp_path_factory.mktemp("plp") / "server.log")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(tiny_target):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_target).eval(), AutoTokenizer.from_pretrained(tiny_target)


def reference(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(model[0](torch.tensor([ids])).logits[0].float(), dim=-1)


def test_echo_with_logprobs_and_max_tokens_zero_scores_the_prompt(client, model) -> None:
    """lm-evaluation-harness's loglikelihood request: echo, logprobs, max_tokens 0."""
    ids = model[1].encode(PROMPT)
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2, temperature=0)
    choice = out.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length" and out.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.tokens == [model[1].decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    ref = reference(model, ids)
    for pos in range(1, len(ids)):
        assert lp.token_logprobs[pos] == pytest.approx(ref[pos - 1, ids[pos]].item(), abs=1e-4)
        top = lp.top_logprobs[pos]
        want = {model[1].decode([t]) for t in ref[pos - 1].topk(2).indices.tolist()} | {lp.tokens[pos]}
        assert set(top) == want


def test_echo_with_logprobs_puts_the_prompt_before_the_answer(client, model) -> None:
    ids = model[1].encode(PROMPT)
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, logprobs=1, temperature=0)
    echoed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, logprobs=1, temperature=0, echo=True)
    lp, gen = echoed.choices[0].logprobs, plain.choices[0].logprobs
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text  # greedy output unchanged
    assert lp.tokens == [model[1].decode([t]) for t in ids] + gen.tokens
    assert lp.token_logprobs[len(ids):] == gen.token_logprobs
    assert lp.text_offset[len(ids)] == len(PROMPT)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_prompt_logprobs_vllm_field(client, model, endpoint: str) -> None:
    extra = {"prompt_logprobs": 3}
    if endpoint == "completions":
        out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0, extra_body=extra)
        given = out.choices[0].model_extra["prompt_logprobs"]
        ids = model[1].encode(PROMPT)
    else:
        messages = [{"role": "user", "content": PROMPT}]
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, temperature=0, extra_body=extra)
        given = out.model_extra["prompt_logprobs"]
        ids = model[1].apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert len(given) == len(ids) == out.usage.prompt_tokens and given[0] is None
    ref = reference(model, ids)
    for pos in range(1, len(ids)):
        entry = given[pos]
        own = entry[str(ids[pos])]
        assert own["logprob"] == pytest.approx(ref[pos - 1, ids[pos]].item(), abs=1e-4)
        assert own["decoded_token"] == model[1].decode([ids[pos]]) and own["rank"] >= 1
        top = ref[pos - 1].topk(3).indices.tolist()
        assert all(str(t) in entry for t in top) and len(entry) in (3, 4)
        ranked = sorted((v["rank"], v["logprob"]) for k, v in entry.items() if int(k) in top)
        assert [r for r, _ in ranked] == [1, 2, 3] and all(a[1] >= b[1] for a, b in zip(ranked, ranked[1:]))


def test_a_cached_prefix_still_gets_every_prompt_logprob(client, model) -> None:
    longer = PROMPT + "And then it ran."
    client.completions.create(model="tiny", prompt=longer, max_tokens=1)  # caches PROMPT's full chunks
    hit = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1)
    assert hit.usage.prompt_tokens_details.cached_tokens > 0
    scored = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 0})
    assert scored.usage.prompt_tokens_details.cached_tokens == 0
    given = scored.choices[0].model_extra["prompt_logprobs"]
    ids = model[1].encode(PROMPT)
    ref = reference(model, ids)
    assert [math.isclose(given[p][str(ids[p])]["logprob"], ref[p - 1, ids[p]].item(), abs_tol=1e-4)
            for p in range(1, len(ids))] == [True] * (len(ids) - 1)


def test_processed_logprobs_mode(client) -> None:
    """A logit bias of 100 on one token: greedy picks it; processed says it was certain, raw does not."""
    bias = {"13": 100}
    raw = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1, logit_bias=bias)
    processed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1,
                                          logit_bias=bias, extra_body={"logprobs_mode": "processed_logprobs"})
    assert raw.choices[0].text == processed.choices[0].text
    assert processed.choices[0].logprobs.token_logprobs[0] == pytest.approx(0.0, abs=1e-4)
    assert raw.choices[0].logprobs.token_logprobs[0] < -1.0


@pytest.mark.parametrize("body, param", [
    ({"prompt": PROMPT, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": PROMPT, "prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": PROMPT, "echo": True, "logprobs": 1, "stream": True}, "logprobs"),
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ({"prompt": PROMPT, "logprobs_mode": "raw_logits"}, "logprobs_mode"),
])
def test_bad_requests_are_400s_naming_the_field(server, body: dict, param: str) -> None:
    import httpx

    out = httpx.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=30)
    assert out.status_code == 400, out.text
    error = out.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["code"]
    if param == "max_tokens":
        assert error["code"] == "integer_below_min_value" and "'echo': true" in error["message"]


def test_lm_evaluation_harness_loglikelihood_request(server, model) -> None:
    """The body lm-evaluation-harness's ``local-completions`` sends for loglikelihood (token-id
    prompts, batched; echo, logprobs 1, max_tokens 1), read back as it reads it: the
    continuation's summed log-probability and whether it is the greedy one."""
    import httpx

    tok = model[1]
    context, continuations = tok.encode("The quick brown fox"), [tok.encode(" jumps"), tok.encode(" sleeps")]
    prompts = [context + c for c in continuations]
    body = {"model": "tiny", "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    for choice, ids in zip(sorted(out["choices"], key=lambda c: c["index"]), prompts, strict=True):
        lps = choice["logprobs"]
        assert len(lps["token_logprobs"]) == len(ids) + 1  # the prompt, then the one generated token
        ref = reference(model, ids)
        want = sum(ref[p - 1, ids[p]].item() for p in range(len(context), len(ids)))
        assert sum(lps["token_logprobs"][len(context):-1]) == pytest.approx(want, abs=1e-4)
        greedy = all(lp == max(top.values()) for lp, top in
                     zip(lps["token_logprobs"][len(context):-1], lps["top_logprobs"][len(context):-1]))
        assert greedy == all(ref[p - 1].argmax().item() == ids[p] for p in range(len(context), len(ids)))
