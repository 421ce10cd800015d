"""Log-probabilities of emitted tokens, read from the logits verification already computed."""

from __future__ import annotations

import torch

from specdec_core.engine.outputs import TokenLogprob


def token_logprobs(logits: torch.Tensor, tokens: list[int], n_top: int) -> list[TokenLogprob]:
    """The target's raw log-probabilities of ``tokens`` (one logits row each) and the ``n_top``
    most likely alternatives: no extra forward."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None]).squeeze(1).tolist()
    top_v, top_i = lp.topk(n_top, dim=-1) if n_top else (lp[:, :0], lp[:, :0].long())
    return [TokenLogprob(t, c, list(zip(ti, tv))) for t, c, ti, tv in zip(tokens, chosen, top_i.tolist(), top_v.tolist())]
