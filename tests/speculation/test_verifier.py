"""The greedy fast path is exactly the temperature-0 limit of the general rejection rule."""

from __future__ import annotations

import torch

from specdec_core.speculation.verifier import verify, verify_greedy


def test_greedy_fast_path_equals_one_hot_rejection_rule():
    gen = torch.Generator().manual_seed(0)
    vocab, bsz = 5, 4
    for _ in range(300):
        ks = torch.randint(0, 4, (bsz,), generator=gen).tolist()
        argmax = torch.randint(0, vocab, (sum(k + 1 for k in ks),), generator=gen)
        drafts, row = [], 0
        for k in ks:
            # Drafts agree with the target's argmax often, so accepted runs of every length occur.
            drafts.append([int(argmax[row + j]) if torch.rand(1, generator=gen) < 0.6
                           else int(torch.randint(0, vocab, (1,), generator=gen)) for j in range(k)])
            row += k + 1
        k_max = max(ks)
        p = torch.zeros(bsz, k_max + 1, vocab)
        q = torch.zeros(bsz, k_max, vocab)
        tok = torch.zeros(bsz, k_max, dtype=torch.long)
        row = 0
        for b, d in enumerate(drafts):
            p[b, torch.arange(len(d) + 1), argmax[row:row + len(d) + 1]] = 1.0
            for j, x in enumerate(d):
                q[b, j, x] = 1.0
                tok[b, j] = x
            row += len(d) + 1
        general = verify(p, q, tok, torch.tensor(ks), torch.rand(bsz, k_max, generator=gen), torch.rand(bsz, generator=gen))
        starts = torch.tensor(ks).add(1).cumsum(0).sub(torch.tensor(ks).add(1)).tolist()
        rows = torch.tensor([start + min(j, k) for start, k in zip(starts, ks) for j in range(k_max + 1)]).view(bsz, k_max + 1)
        fast = verify_greedy(argmax[rows], tok, torch.tensor(ks))
        assert torch.equal(fast.num_accepted, general.num_accepted) and torch.equal(fast.final_token, general.final_token)
