"""Log-probabilities read from logits a step already computed: of emitted tokens (verification's
rows) and of prompt tokens (the prefill's rows, for requests that ask)."""

from __future__ import annotations

import torch

from specdec_core.decoding.token_logprob import TokenLogprob


def token_logprobs(scores: torch.Tensor, tokens: list[int], n_top: int, *, ranks: bool = False) -> list[TokenLogprob]:
    """The log-probabilities of ``tokens`` (one row of ``scores`` each: raw logits, or the
    processed scores a request samples from) and the ``n_top`` most likely alternatives: no
    extra forward. Tokens a processed row rules out (-inf) are never listed as alternatives.
    ``ranks``: also each token's rank (1 = the most likely), a compare over the vocabulary."""
    if not tokens:
        return []
    lp = torch.log_softmax(scores.float(), dim=-1)
    index = torch.tensor(tokens, device=lp.device)[:, None]
    chosen_t = lp.gather(1, index)
    chosen = chosen_t.squeeze(1).tolist()
    rank = ((lp > chosen_t).sum(dim=1) + 1).tolist() if ranks else [None] * len(tokens)
    top_v, top_i = lp.topk(n_top, dim=-1) if n_top else (lp[:, :0], lp[:, :0].long())
    out = []
    for t, c, r, ti, tv in zip(tokens, chosen, rank, top_i.tolist(), top_v.tolist()):
        top = [(i, v) for i, v in zip(ti, tv) if v != float("-inf")]
        out.append(TokenLogprob(t, c, top, r))
    return out
