"""Propose, score and verify one step on the device: one upload, one read.

The host plans the whole step first: n-gram lookups, every draft and target forward's indices,
every logits row's warping rule and every request's uniforms go into one ``HostUpload``. Then the
device runs it: the draft model draws its drafts position after position into a ``[B, K]``
tensor, the target scores every request's last token and drafts in one forward (the drafts fed
from that tensor), and verification accepts and samples for all requests at once. The outcome,
``[B, K+2]`` (drafts, accepted count, next token), comes back in one read, which is all the
commit needs. Nothing here moves request state: a step that fails leaves nothing to undo.

Host round trips per step: two (the upload and the read), plus one per draft position and one
before verification for requests with a grammar (their masks depend on the drafts), plus one
for requests that ask for log-probabilities.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec_core.decoding.sampling import TablePlan, stack_masks
from specdec_core.engine.step_plan import ScheduledRequest
from specdec_core.execution.host_upload import HostUpload
from specdec_core.execution.model_runner import ForwardItem, ModelRunner
from specdec_core.speculation import verifier
from specdec_core.speculation.draft_model import DraftModelProposer
from specdec_core.speculation.ngram import NgramProposer


@dataclass
class StepOutcome:
    """What the commit reads: per item its drafts, how many were accepted and the next token
    (``None`` for an item still in prefill), the target logits and where each item's rows start,
    and the draft cache lengths after the step."""

    drafts: list[list[int]]
    accepted: list[int | None]
    final: list[int | None]
    logits: torch.Tensor
    row_start: list[int]
    draft_cached: list[int | None]
    draft_seconds: float = 0.0


class SpeculativeStep:
    """Runs the propose -> forward -> verify part of a step for the planned items."""

    def __init__(self, target: ModelRunner, drafter: DraftModelProposer | None, ngram: NgramProposer | None) -> None:
        self.target, self.drafter, self.ngram = target, drafter, ngram

    def run(self, items: list[ScheduledRequest]) -> StepOutcome:
        device = self.target.device
        looked_up = {b: self.ngram.lookup(it.request, it.num_drafts) for b, it in enumerate(items)
                     if self.ngram is not None and it.source == "ngram" and it.num_drafts}
        drafter = self.drafter if self.drafter is not None and self.drafter.wanted(items) else None
        drawn = [drafter.drafts(it) if drafter is not None else 0 for it in items]
        num = [len(looked_up[b]) if b in looked_up else drawn[b] for b in range(len(items))]
        k_max = max(num, default=0)
        verifying = [it.completes for it in items]

        upload = HostUpload()
        draft_ref = upload.ints(t for b in range(len(items)) for t in (looked_up.get(b, []) + [0] * k_max)[:k_max])
        u_draft, u_verify = self._uniforms(items, drawn, num, k_max, upload)
        dplan = drafter.plan(items, k_max, upload) if drafter is not None else None
        fwd, fill_rows, fill_src, row_start = [], [], [], []
        row = 0
        for b, it in enumerate(items):
            r = it.request
            known = r.all_ids[r.num_computed:r.num_computed + it.num_new]
            fill_rows += range(row + len(known), row + len(known) + drawn[b])
            fill_src += range(b * k_max, b * k_max + drawn[b])
            fwd.append(ForwardItem(r.cache_slot, r.num_computed, known + looked_up.get(b, [0] * drawn[b]),
                                   1 + num[b] if verifying[b] else 0, num_drafts=num[b]))
            row += len(known) + num[b]
        for b in range(len(items)):
            row_start.append(row_start[-1] + (1 + num[b - 1] if verifying[b - 1] else 0) if b else 0)
        tplan = self.target.plan(fwd, upload)
        fill = (upload.ints(fill_rows), upload.ints(fill_src)) if fill_rows else None
        vplan = self._plan_verification(items, num, drawn, verifying, k_max, upload) if any(verifying) else None
        upload.send(device)

        drafts = upload[draft_ref].view(len(items), k_max).clone()
        t0 = time.perf_counter()
        q = drafter.run(dplan, items, upload, drafts, upload[u_draft].view(len(items), k_max)) if dplan else None
        draft_seconds = time.perf_counter() - t0
        ids = upload[tplan.refs["ids"]]
        if fill is not None:
            ids = ids.index_copy(0, upload[fill[0]], drafts.view(-1).index_select(0, upload[fill[1]]))
        logits = self.target.run(tplan, upload, input_ids=ids)
        cached = dplan.cached if dplan is not None else [None] * len(items)
        if vplan is None:
            return StepOutcome([[] for _ in items], [None] * len(items), [None] * len(items), logits, row_start, cached,
                               draft_seconds)
        masks = self._grammar_masks(items, num, verifying, drafts, q, looked_up)
        packed = verifier.verify_step(logits, vplan, upload, drafts, q, upload[u_verify].view(len(items), k_max + 1), masks)
        values = packed.tolist()  # the step's one read
        return StepOutcome(
            [v[:num[b]] for b, v in enumerate(values)],
            [v[k_max] if verifying[b] else None for b, v in enumerate(values)],
            [v[k_max + 1] if verifying[b] else None for b, v in enumerate(values)],
            logits, row_start, cached, draft_seconds)

    @staticmethod
    def _uniforms(items: list[ScheduledRequest], drawn: list[int], num: list[int], k_max: int,
                  upload: HostUpload) -> tuple:  # type: ignore[type-arg]
        """Each sampled request's draws for this step from its own stream, in a fixed order (its
        draft positions, then its verification): the count depends only on its own plan."""
        draft_u: list[float] = []
        verify_u: list[float] = []
        for b, it in enumerate(items):
            r = it.request
            d = r.draws(drawn[b]) if not r.params.greedy else [0.0] * drawn[b]
            v = r.draws(num[b] + 1) if it.completes and not r.params.greedy else [0.0] * (num[b] + 1)
            draft_u += d + [0.0] * (k_max - drawn[b])
            verify_u += v + [0.0] * (k_max - num[b])
        return upload.floats(draft_u), upload.floats(verify_u)

    def _plan_verification(self, items: list[ScheduledRequest], num: list[int], drawn: list[int], verifying: list[bool],
                           k_max: int, upload: HostUpload) -> verifier.VerifyPlan:
        rows, history = [], []
        for b, it in enumerate(items):
            if not verifying[b]:
                continue
            for j in range(num[b] + 1):
                history += [(len(rows), b * k_max + i) for i in range(j)]
                rows.append(it.request.row_params(j))
        table = TablePlan.of(rows, self.target.vocab_size, upload, history)
        return verifier.VerifyPlan.of([1 + num[b] if verifying[b] else 0 for b in range(len(items))], num,
                                      [drawn[b] == 0 for b in range(len(items))], table, k_max, upload)

    def _grammar_masks(self, items: list[ScheduledRequest], num: list[int], verifying: list[bool], drafts: torch.Tensor,
                       q: torch.Tensor | None, looked_up: dict[int, list[int]]) -> torch.Tensor | None:
        """The target rows' grammar masks; drafts the model drew for a grammar request are read
        to the host for them (one round trip). Rows after a draft drawn from an empty q (the
        grammar left the draft head nothing) are never used: verification rejects that draft."""
        grammar = [b for b, it in enumerate(items) if verifying[b] and it.request.grammar is not None]
        if not grammar:
            return None
        need_read = any(b not in looked_up and num[b] for b in grammar)
        known = drafts.tolist() if need_read else None
        alive = (q.sum(dim=-1) > 0).tolist() if need_read and q is not None else None
        vocab = self.target.vocab_size
        masks: list[torch.Tensor | None] = []
        for b, it in enumerate(items):
            if not verifying[b]:
                continue
            r = it.request
            tokens = looked_up.get(b) or (known[b][:num[b]] if known is not None else [])
            for j in range(num[b] + 1):
                if r.grammar is None:
                    masks.append(None)
                elif b in looked_up or alive is None or all(alive[b][:j]):
                    masks.append(r.grammar_mask(tokens[:j]))
                else:
                    masks.append(torch.zeros(vocab, dtype=torch.bool))
        return stack_masks(masks, vocab, drafts.device)
