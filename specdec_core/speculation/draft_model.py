"""The draft-model proposer: a small model samples each request's drafts on the device; its q is
the distribution each draft was sampled from.

A step's drafting is planned on the host first (``plan``: which requests draft at each position,
every forward's indices, every row's warping rule, all in the step's one upload), then run on the
device (``run``): a drawn token feeds the next position's forward and the verification straight
from device memory, so drafting k positions costs no host round trip. Only a request with a
grammar needs its drafts on the host (its next mask depends on them): one read per position then.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_core.decoding.sampling import TablePlan, apply, sample, stack_masks
from specdec_core.execution.forward_plan import ForwardItem, ForwardPlan
from specdec_core.execution.host_upload import HostUpload, Ref
from specdec_core.execution.model_runner import ModelRunner
from specdec_core.speculation.scheduled_request import ScheduledItems, ScheduledRequest, SpeculatingRequest


@dataclass
class DraftPlan:
    """Position j's forward, the items drafting at j (``active[j]``, with their indices in the
    upload) and their warping rules; ``cached[b]`` is item b's draft-cache length afterwards."""

    forwards: list[ForwardPlan]
    active: list[list[int]]
    active_refs: list[Ref]
    tables: list[TablePlan]
    cached: list[int | None]


class DraftModelProposer:
    """Drafts with a small model: one batched forward per draft position for all requests.

    The draft cache lags the target by design: a request is caught up (all its tokens since its
    ``draft_computed``) in the first forward of a step in which it drafts, and prompt chunks of
    speculating requests are mirrored while the draft model is in use (some request drafts this
    step), so the catch-up rarely has to re-read a whole prompt. Otherwise prompts are not
    mirrored: that work is wasted unless the request drafts later, and then the catch-up does it.
    Where a lookup wins from the first step, or the draft never pays (a full batch; a GPU, where
    a draft position costs 0.7 of a target step), the draft model never reads the prompt.
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    @staticmethod
    def drafts(item: ScheduledRequest[SpeculatingRequest]) -> int:
        return item.num_drafts if item.source == "draft" else 0

    def _mirrors(self, item: ScheduledRequest[SpeculatingRequest], in_use: bool) -> bool:
        """Seeded sampled requests are always mirrored: how their draft cache is segmented (and
        so the last bits of their draft distributions) must not depend on the batch."""
        r = item.request
        return ((in_use or r.seeded) and self.drafts(item) == 0 and r.in_prefill
                and r.max_spec_tokens > 0 and r.draft_computed == r.num_computed)

    def _in_use(self, items: ScheduledItems) -> bool:
        return any(self.drafts(it) for it in items)

    def wanted(self, items: ScheduledItems) -> bool:
        in_use = self._in_use(items)
        return any(self.drafts(it) or self._mirrors(it, in_use) for it in items)

    def plan(self, items: ScheduledItems, k_max: int, upload: HostUpload) -> DraftPlan:
        """Every forward and warping rule of this step's drafting, placed in ``upload``.
        ``k_max`` is the width of the step's drafts tensor (draft history indices use it)."""
        in_use = self._in_use(items)
        counts = [self.drafts(it) for it in items]
        mirrored = [b for b, it in enumerate(items) if self._mirrors(it, in_use)]
        cached: list[int | None] = [None] * len(items)
        for b in mirrored:
            cached[b] = items[b].request.num_computed + items[b].num_new
        forwards, active, tables = [], [], []
        for j in range(max(max(counts, default=0), 1)):
            act = [b for b, c in enumerate(counts) if c > j]
            if j == 0:
                fwd = [self._catch_up(items[b], 1) for b in act] + [self._catch_up(items[b], 0) for b in mirrored]
            else:  # the token drawn at j - 1 is fed at the position after the cached ones
                fwd = [ForwardItem(items[b].request.blocks, items[b].request.num_computed + items[b].num_new + j - 1,
                                   [0], 1) for b in act]
            if not fwd:
                break
            forwards.append(self.runner.plan(fwd, upload))
            active.append(act)
            rows = [items[b].request.row_params(j) for b in act]
            history = [(r, b * k_max + i) for r, b in enumerate(act) for i in range(j)]
            tables.append(TablePlan.of(rows, self.runner.vocab_size, upload, history))
            for b in act:
                cached[b] = items[b].request.num_computed + items[b].num_new + j
        return DraftPlan(forwards, active, [upload.ints(a) for a in active], tables, cached)

    def run(self, plan: DraftPlan, items: ScheduledItems, upload: HostUpload, drafts: torch.Tensor,
            u: torch.Tensor) -> torch.Tensor:
        """Draw the drafts into ``drafts`` ``[B, K]`` with uniforms ``u`` ``[B, K]``; return q
        ``[B, K, V]`` (all-zero rows where nothing was drawn, or where a grammar left the draft
        head no token: verification rejects those)."""
        bsz, k_max = drafts.shape
        probs = torch.zeros(bsz, k_max, self.runner.vocab_size, device=drafts.device)
        for j, (fwd, act) in enumerate(zip(plan.forwards, plan.active)):
            rows = upload[plan.active_refs[j]]
            ids = drafts[:, j - 1].index_select(0, rows) if j > 0 else None
            logits = self.runner.run(fwd, upload, input_ids=ids)
            if not act:
                break  # prompt chunks mirrored into the draft cache, nothing drafts
            table = plan.tables[j].table(upload)
            grammar_rows = [r for r, b in enumerate(act) if items[b].request.grammar is not None]
            if grammar_rows:
                table.allowed = self._grammar_masks(items, act, j, drafts, probs)
            q = apply(logits[: len(act)], table, drafts)
            column = torch.full_like(rows, j)
            probs.index_put_((rows, column), q)
            # Greedy rows are one-hot: their argmax is the draw (no CDF over the vocabulary).
            drawn = q.argmax(dim=-1) if table.all_greedy else sample(q, u.index_select(0, rows)[:, j])
            drafts.index_put_((rows, column), drawn)
        return probs

    def _grammar_masks(self, items: ScheduledItems, act: list[int], j: int, drafts: torch.Tensor,
                       probs: torch.Tensor) -> torch.Tensor | None:
        """Masks after each grammar request's drafts so far (read to the host: one round trip).
        A request whose earlier draft had no allowed token left gets an all-False row: its
        draft there is rejected by verification, nothing after it counts."""
        known: list[list[int]] = [[] for _ in range(drafts.shape[0])]
        alive: list[list[bool]] = [[] for _ in range(drafts.shape[0])]
        if j > 0:
            known, alive = drafts[:, :j].tolist(), (probs[:, :j].sum(dim=-1) > 0).tolist()
        masks = [items[b].request.row_mask(known[b], all(alive[b])) for b in act]
        return stack_masks(masks, self.runner.vocab_size, drafts.device)

    @staticmethod
    def _catch_up(item: ScheduledRequest[SpeculatingRequest], num_logits: int) -> ForwardItem:
        r = item.request
        return ForwardItem(r.blocks, r.draft_computed, r.all_ids[r.draft_computed:r.num_computed + item.num_new], num_logits)

