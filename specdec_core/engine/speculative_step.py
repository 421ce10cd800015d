"""Propose, score and verify one step on the device: one upload, one read.

The host plans the whole step first: the drafts the policy looked up (n-gram, suffix; looked up
once, by the policy), every draft and target forward's indices, every logits row's warping rule
and every request's uniforms go into one ``HostUpload``. Then the
device runs it: the draft model draws its drafts position after position into a ``[B, K]``
tensor, the target scores every request's last token and drafts in one forward (the drafts fed
from that tensor), and verification accepts and samples for all requests at once. The outcome,
``[B, K+2]`` (drafts, accepted count, next token), comes back in one read, which is all the
commit needs. The phases are timed for the cost model (CUDA events on a GPU, read after that
one read). Nothing here moves request state: a step that fails leaves nothing to undo. Even the
random draws are taken from copies of the requests' streams (``Request.stream_ahead``), which
the outcome hands to the commit; a failed step that is run again draws the same numbers.

Host round trips per step: two (the upload and the read), plus one per draft position and one
before verification for requests with a grammar (their masks depend on the drafts), plus one
for requests that ask for log-probabilities. Requests that ask for prompt log-probabilities get
their prompt rows' logits too (after every item's verification rows, which keep their places);
requests that ask for processed log-probabilities get the scores they sampled from (one more
warping pass, only in steps that have such a request).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from specdec_core.decoding.sampling import RowParams, TablePlan, processed_scores, stack_masks
from specdec_core.engine.request import Request
from specdec_core.execution.forward_plan import ForwardItem, ForwardPlan
from specdec_core.execution.host_upload import HostUpload, Ref
from specdec_core.execution.kv_cache import token_rows
from specdec_core.execution.model_runner import ModelRunner
from specdec_core.speculation import verifier
from specdec_core.speculation.draft_model import DraftModelProposer, DraftPlan
from specdec_core.speculation.draft_tree import DraftTree
from specdec_core.speculation.scheduled_request import ScheduledRequest


@dataclass
class ItemOutcome:
    """One item's share of the step, what the commit reads of it. ``accepted`` of ``drafts`` were
    kept and ``final`` follows them (both None for an item still in prefill: nothing verified);
    its verification rows start at ``row_start`` of the step's logits, its prompt rows
    (``ScheduledRequest.prompt_rows``) at ``prompt_start`` of the prompt logits; ``draft_cached``:
    its draft-cache length after the step (None: unchanged); ``stream``: the copy of its random
    stream the step drew from (None: it drew nothing), to continue from (``Request.commit_draws``)."""

    drafts: list[int]
    accepted: int | None
    final: int | None
    row_start: int
    prompt_start: int
    draft_cached: int | None
    stream: random.Random | None


@dataclass
class StepOutcome:
    """What the commit reads: each item's outcome (``items``, in the step's order), the target
    logits of the verification rows, the prompt positions' rows (``prompt_logits``) and the
    verification rows' processed scores (``processed``, rows as ``logits``) when some item asked
    for them, and the phases' times for the cost model."""

    items: list[ItemOutcome]
    logits: torch.Tensor
    draft_seconds: float = 0.0  # the draft model's forwards and draws
    target_seconds: float = 0.0  # the target forward
    prompt_logits: torch.Tensor | None = None
    processed: torch.Tensor | None = None
    tree_counts: tuple[int, int] = (0, 0)  # verify passes of token trees; accepted tokens off their first chain


class _Clock:
    """Marks between the step's phases. On CUDA the host runs ahead of the device, so wall-clock
    marks would time the launches: there the marks are CUDA events, read after the step's one
    read has synchronised (no extra stall)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []  # type: ignore[type-arg]

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self, i: int) -> float:
        """Seconds between mark i and mark i + 1."""
        a, b = self.marks[i], self.marks[i + 1]
        return a.elapsed_time(b) / 1000 if self.cuda else b - a


@dataclass
class _Plan:
    """The host half of a step: its shape and where everything sits in the upload."""

    looked_up: dict[int, DraftTree]  # item -> looked-up drafts (one-hot q), a chain or a token tree
    drawn: list[int]  # item -> drafts the draft model draws
    num: list[int]  # item -> drafts verified
    verifying: list[bool]  # item -> it completes its known tokens this step (logits wanted)
    k_max: int
    drafts: Ref  # [B, K] looked-up drafts, zeros where the draft model will draw
    u_draft: Ref  # [B, K]
    u_verify: Ref  # [B, K+1]
    streams: list[random.Random | None]  # item -> the copy of its stream its draws came from
    target: ForwardPlan
    fill: tuple[Ref, Ref] | None  # target rows fed by drawn drafts, and their flat index in the drafts
    row_start: list[int]  # item -> its first logits row
    prompt_start: list[int]  # item -> its first prompt row after the verification rows
    verify_rows: int  # logits rows verification reads (the prompt rows follow them)
    tree_paths: dict[int, list[list[int]]]  # item whose drafts branch -> each node's path (DraftTree.paths)
    draft: DraftPlan | None = None
    verify: verifier.VerifyPlan | None = None


class SpeculativeStep:
    """Runs the propose -> forward -> verify part of a step for the planned items."""

    def __init__(self, target: ModelRunner, drafter: DraftModelProposer | None) -> None:
        self.target, self.drafter = target, drafter

    def run(self, items: list[ScheduledRequest[Request]]) -> StepOutcome:
        upload = HostUpload()
        plan = self._plan(items, upload)
        upload.send(self.target.device)
        bsz, k_max = len(items), plan.k_max
        drafts = upload[plan.drafts].view(bsz, k_max).clone()
        clock = _Clock(drafts.device)
        clock.mark()
        q = None
        if plan.draft is not None and self.drafter is not None:
            q = self.drafter.run(plan.draft, items, upload, drafts, upload[plan.u_draft].view(bsz, k_max))
        clock.mark()
        ids = upload[plan.target.refs["ids"]]
        if plan.fill is not None:
            ids = ids.index_copy(0, upload[plan.fill[0]], drafts.view(-1).index_select(0, upload[plan.fill[1]]))
        logits = self.target.run(plan.target, upload, input_ids=ids)
        clock.mark()
        prompt_logits = None
        if logits.shape[0] > plan.verify_rows:
            logits, prompt_logits = logits[:plan.verify_rows], logits[plan.verify_rows:]
        if plan.verify is None:
            if clock.cuda:
                torch.cuda.synchronize()
            return StepOutcome(self._outcomes(plan, [None] * bsz), logits, clock.seconds(0), clock.seconds(1),
                               prompt_logits)
        masks = self._grammar_masks(items, plan, drafts, q)
        packed = verifier.verify_step(logits, plan.verify, upload, drafts, q,
                                      upload[plan.u_verify].view(bsz, k_max + 1), masks)
        processed = None
        if any(v and it.request.params.logprobs_mode == "processed_logprobs" for v, it in zip(plan.verifying, items)):
            table = plan.verify.table.table(upload)
            table.allowed = masks
            processed = processed_scores(logits, table, drafts)
        rows = [verifier.VerifiedRow.of(v, k_max) for v in packed.tolist()]  # the step's one read
        verified = [row if plan.verifying[b] else None for b, row in enumerate(rows)]
        outcomes = self._outcomes(plan, verified)
        branch_tokens = 0
        for b in plan.tree_paths:
            outcomes[b].drafts, off_chain = self._settle_tree(items[b], plan.looked_up[b], rows[b].path)
            branch_tokens += off_chain
        return StepOutcome(outcomes, logits, clock.seconds(0), clock.seconds(1), prompt_logits, processed,
                           (len(plan.tree_paths), branch_tokens))

    @staticmethod
    def _outcomes(plan: _Plan, verified: list[verifier.VerifiedRow | None]) -> list[ItemOutcome]:
        """Each item's outcome from its plan and its verified row (None: not verified)."""
        cached = plan.draft.cached if plan.draft is not None else [None] * len(verified)
        return [ItemOutcome(row.drafts[:plan.num[b]] if row else [], row.accepted if row else None,
                            row.final if row else None, plan.row_start[b], plan.prompt_start[b], cached[b],
                            plan.streams[b])
                for b, row in enumerate(verified)]

    def _plan(self, items: list[ScheduledRequest[Request]], upload: HostUpload) -> _Plan:
        """How many drafts each item verifies, and everything the device needs. Looked-up drafts
        are the policy's (``ScheduledRequest.looked_up``): the lookup is not made again."""
        looked_up = {b: it.looked_up for b, it in enumerate(items) if it.looked_up is not None}
        drafter = self.drafter if self.drafter is not None and self.drafter.wanted(items) else None
        drawn = [drafter.drafts(it) if drafter is not None else 0 for it in items]
        num = [len(looked_up[b]) if b in looked_up else drawn[b] for b in range(len(items))]
        tree_paths = {b: t.paths() for b, t in looked_up.items() if not t.is_chain}
        k_max = max(num, default=0)
        verifying = [it.completes for it in items]
        draft_ref = upload.ints(t for b in range(len(items))
                                for t in ((looked_up[b].tokens if b in looked_up else []) + [0] * k_max)[:k_max])
        u_draft, u_verify, streams = self._uniforms(items, drawn, num, k_max, upload)
        draft_plan = drafter.plan(items, k_max, upload) if drafter is not None else None
        forward: list[ForwardItem] = []
        fill_rows: list[int] = []
        fill_src: list[int] = []
        row_start: list[int] = []
        prompt_start: list[int] = []
        row = logits_row = prompt_row = 0
        for b, it in enumerate(items):
            r = it.request
            known = r.all_ids[r.num_computed:r.num_computed + it.num_new]
            fill_rows += range(row + len(known), row + len(known) + drawn[b])
            fill_src += range(b * k_max, b * k_max + drawn[b])
            tree = looked_up.get(b)
            forward.append(ForwardItem(r.blocks, r.num_computed, known + (tree.tokens if tree else [0] * drawn[b]),
                                       1 + num[b] if verifying[b] else 0, num_drafts=num[b],
                                       extra_logits=it.prompt_rows,
                                       draft_paths=tree_paths.get(b)))
            row += len(known) + num[b]
            row_start.append(logits_row)
            logits_row += 1 + num[b] if verifying[b] else 0
            prompt_start.append(prompt_row)
            prompt_row += it.prompt_rows
        target = self.target.plan(forward, upload)
        fill = (upload.ints(fill_rows), upload.ints(fill_src)) if fill_rows else None
        plan = _Plan(looked_up, drawn, num, verifying, k_max, draft_ref, u_draft, u_verify, streams, target, fill,
                     row_start, prompt_start, logits_row, tree_paths, draft_plan)
        if any(verifying):
            plan.verify = self._plan_verification(items, plan, upload)
        return plan

    @staticmethod
    def _uniforms(items: list[ScheduledRequest[Request]], drawn: list[int], num: list[int], k_max: int,
                  upload: HostUpload) -> tuple[Ref, Ref, list[random.Random | None]]:
        """Each sampled request's draws for this step from a copy of its own stream, in a fixed
        order (its draft positions, then its verification): the count depends only on its own
        plan. Returns the copies too: the commit continues from them, a re-run starts over."""
        draft_u: list[float] = []
        verify_u: list[float] = []
        streams: list[random.Random | None] = []
        for b, it in enumerate(items):
            r = it.request
            stream = r.stream_ahead() if not r.params.greedy and (drawn[b] or it.completes) else None
            d = [stream.random() for _ in range(drawn[b])] if stream is not None else [0.0] * drawn[b]
            v = ([stream.random() for _ in range(num[b] + 1)] if stream is not None and it.completes
                 else [0.0] * (num[b] + 1))
            draft_u += d + [0.0] * (k_max - drawn[b])
            verify_u += v + [0.0] * (k_max - num[b])
            streams.append(stream)
        return upload.floats(draft_u), upload.floats(verify_u), streams

    def _plan_verification(self, items: list[ScheduledRequest[Request]], plan: _Plan, upload: HostUpload) -> verifier.VerifyPlan:
        """Each verified row's warping rule; its history is the drafts before it, the node's
        ancestors in a tree."""
        rows: list[RowParams] = []
        history: list[tuple[int, int]] = []
        for b, it in enumerate(items):
            if not plan.verifying[b]:
                continue
            paths = plan.tree_paths.get(b) or [list(range(j + 1)) for j in range(plan.num[b])]
            before: list[int]
            for before in [[]] + paths:
                history += [(len(rows), b * plan.k_max + i) for i in before]
                rows.append(it.request.row_params(len(before)))
        table = TablePlan.of(rows, self.target.vocab_size, upload, history)
        return verifier.VerifyPlan.of([1 + n if v else 0 for n, v in zip(plan.num, plan.verifying)], plan.num,
                                      [d == 0 for d in plan.drawn], table, plan.k_max, upload,
                                      [plan.looked_up[b].parents if b in plan.tree_paths else list(range(-1, n - 1))
                                       for b, n in enumerate(plan.num)] if plan.tree_paths else None)

    def _settle_tree(self, item: ScheduledRequest[Request], tree: DraftTree, path: list[int]) -> tuple[list[int], int]:
        """After a tree's verification: move the accepted path's keys and values to the positions
        the path now holds (node j's were written at position known + j). Returns the drafts the
        commit sees (the accepted path, then the likelier branch below where it stopped: the chain
        this pass amounts to, so acceptance is counted as for a chain) and how many accepted
        tokens came from off the first chain. Only cache rows past the request's committed tokens
        move: a step that fails later leaves nothing to undo."""
        known_end = item.request.num_computed + item.num_new
        moves = [(known_end + node, known_end + d) for d, node in enumerate(path) if node != d]
        if moves:
            bs = self.target.cache.block_size
            blocks = item.request.blocks
            self.target.cache.copy_rows([token_rows(blocks, bs, s, s + 1)[0] for s, _ in moves],
                                        [token_rows(blocks, bs, d, d + 1)[0] for _, d in moves])
        rest, node = [], path[-1] if path else -1
        while node in tree.parents:
            node = tree.parents.index(node)
            rest.append(tree.tokens[node])
        return [tree.tokens[node] for node in path] + rest, sum(node >= tree.chain_length for node in path)

    def _grammar_masks(self, items: list[ScheduledRequest[Request]], plan: _Plan, drafts: torch.Tensor,
                       q: torch.Tensor | None) -> torch.Tensor | None:
        """The target rows' grammar masks; drafts the model drew for a grammar request are read
        to the host for them (one round trip). Rows after a draft drawn from an empty q (the
        grammar left the draft head nothing) are never used: verification rejects that draft."""
        num, verifying, looked_up = plan.num, plan.verifying, plan.looked_up
        grammar = [b for b, it in enumerate(items) if verifying[b] and it.request.grammar is not None]
        if not grammar:
            return None
        need_read = any(b not in looked_up and num[b] for b in grammar)
        known = drafts.tolist() if need_read else None
        alive = (q.sum(dim=-1) > 0).tolist() if need_read and q is not None else None
        masks: list[torch.Tensor | None] = []
        for b, it in enumerate(items):
            if not verifying[b]:
                continue
            tokens = looked_up[b].tokens if b in looked_up else (known[b][:num[b]] if known is not None else [])
            live = b in looked_up or alive is None
            masks += [it.request.row_mask(tokens[:j], live or all(alive[b][:j])) for j in range(num[b] + 1)]  # type: ignore[index]
        return stack_masks(masks, self.target.vocab_size, drafts.device)
