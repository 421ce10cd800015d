"""The synchronous engine: one ``step()`` drafts, verifies and commits for every running request.

A step, for the requests the scheduler picked:
  0. the speculation policy picks, per request, a proposer (draft model or n-gram lookup) and how
     many drafts (0..k) make the step's committed tokens per second highest, from measured costs;
  1. the proposers draft (one batched draft-model forward per draft position) and mirror prefill
     chunks into the draft model's cache;
  2. one packed target forward scores every request's last token + drafts, and prefill chunks;
  3. one vectorised verification decides, for all requests at once, how many drafts survive and
     which token follows them;
  4. commit: tokens are appended, stop conditions checked, caches rolled back by length.
Everything here runs on the engine thread; ``AsyncEngine`` is the thread-safe facade.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass

import torch

from specdec_core.engine.config import EngineConfig
from specdec_core.decoding.detokenizer import IncrementalDetokenizer
from specdec_core.loading.draft_vocab import frequent_token_ids
from specdec_core.decoding.eos import eos_token_ids
from specdec_core.decoding.grammar import CompiledGrammar, GrammarCompiler
from specdec_core.engine.stats import EngineMetrics
from specdec_core.execution.model_runner import ForwardItem, ModelRunner
from specdec_core.engine.outputs import RequestOutput, TokenLogprob
from specdec_core.loading.progress_log import phase
from specdec_core.speculation.cost_model import StepCostModel, calibrate
from specdec_core.speculation.proposer import DraftModelProposer, NgramIndex, Proposal, propose
from specdec_core.engine.request import Request
from specdec_core.decoding.sampling import warp
from specdec_core.decoding.sampling_params import SamplingParams
from specdec_core.decoding.structured_output import StructuredOutput
from specdec_core.engine.scheduler import ScheduledStep, Scheduler
from specdec_core.speculation.policy import SpeculationPolicy
from specdec_core.speculation.verifier import VerifyResult, verify, verify_greedy

log = logging.getLogger("specdec.engine")

# A request whose prompt contains this marker fails while being committed. It exists so tests can
# prove that one request's failure leaves the others running; unset, it costs nothing.
FAULT_INJECTION_ENV = "SPECDEC_FAULT_INJECTION"


@dataclass
class Completion:
    """Result of the offline ``Engine.generate`` helper."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stats: object


class Engine:
    """Owns the models, caches, scheduler and proposer. Not thread-safe: drive it from one thread."""

    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        from specdec_core.loading.loader import load_model, resolve_device, resolve_dtype, resolve_quantize

        self.config = config
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        resolve_quantize(config.quantize, device, dtype)  # refuse a bad combination before loading
        method = config.speculative_method or (
            "auto" if (config.draft_model or config.model is None) else "ngram"
        )
        if method in ("draft", "auto") and config.draft_model is None and config.model is not None:
            raise ValueError(f"speculative_method {method!r} needs a draft model (--draft-model)")
        load = dict(device=device, dtype=dtype, cache_dir=config.cache_dir, progress=progress)
        target = load_model(config.model, role="target", **load)
        draft = load_model(config.draft_model, role="draft", **load) if method in ("draft", "auto") else None
        self._setup(config, target, draft, method, owns_models=True)

    @classmethod
    def from_loaded(cls, config: EngineConfig, target, draft=None) -> "Engine":
        """Build an engine around already loaded models (``LoadedModel``), e.g. to share them."""
        engine = cls.__new__(cls)
        method = config.speculative_method or ("auto" if draft is not None else "ngram")
        if method in ("draft", "auto") and draft is None:
            raise ValueError(f"speculative_method {method!r} needs a draft model")
        engine._setup(config, target, draft if method in ("draft", "auto") else None, method)
        return engine

    def _setup(self, config: EngineConfig, target, draft, method: str, owns_models: bool = False) -> None:
        from specdec_core.loading.loader import resolve_quantize
        from specdec_core.loading.tokenizer_compat import check_pair, output_vocab_size

        self.config = config
        self.tokenizer = target.tokenizer
        self.model_name = target.name
        self.method = method
        vocab = check_pair(target, draft) if draft is not None else min(
            len(target.tokenizer), output_vocab_size(target.model))
        self.vocab_size = vocab
        self.max_model_len = config.max_model_len
        self.num_speculative_tokens = 0 if method == "none" else config.num_speculative_tokens
        self.eos_ids = eos_token_ids(target.model, target.tokenizer)
        param = next(target.model.parameters())
        self.quantize = resolve_quantize(config.quantize, param.device, param.dtype)
        runner = dict(num_slots=config.max_num_seqs, max_len=config.max_model_len, vocab_size=vocab,
                      quantize=self.quantize, release_weights=owns_models)
        with phase(log, f"preparing {self.quantize} kernels for the target model"):
            self.target = ModelRunner(target.model, **runner)
        self.draft_runner = None
        if draft is not None:
            head = frequent_token_ids(self.tokenizer, config.draft_vocab_size, vocab, self.eos_ids)
            with phase(log, f"preparing {self.quantize} kernels for the draft model"):
                self.draft_runner = ModelRunner(draft.model, **runner, head_rows=head)
        self.drafter = DraftModelProposer(self.draft_runner) if self.draft_runner is not None else None
        log.info("execution: target %s path, draft %s, quantize=%s", self.target.path,
                 self.draft_runner.path if self.draft_runner else "none", self.quantize)
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens)
        self.metrics = EngineMetrics()
        self._seed_rng = torch.Generator().manual_seed(config.seed if config.seed is not None else int(time.time_ns() % 2**31))
        self._fault_marker = os.environ.get(FAULT_INJECTION_ENV) or None
        self._faulty: set[str] = set()
        self.costs = self._measure_costs()
        self.grammars = GrammarCompiler(self.tokenizer, vocab, self.eos_ids)
        self.policy = SpeculationPolicy(method, self.costs, config.adaptive_speculation, self.max_model_len, _lookup)

    # ------------------------------------------------------------------ requests in and out

    def compile_structured(self, spec: StructuredOutput) -> CompiledGrammar:
        """Compile (and cache) a structured-output spec; ``ValueError`` says why it cannot be.
        Safe from any thread: servers call it off the event loop before submitting."""
        return self.grammars.compile(spec)

    def make_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None) -> Request:
        """Validate and tokenize; safe to call from any thread (it touches no engine state)."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size}); got {bad[:5]}")
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}; "
                "it must leave room for at least one generated token"
            )
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        k = self.num_speculative_tokens
        if params.num_speculative_tokens is not None:
            k = min(k, params.num_speculative_tokens)
        rid = request_id or uuid.uuid4().hex
        req = Request(rid, ids, params, torch.Generator().manual_seed(seed),
                      IncrementalDetokenizer(self.tokenizer, params.stop), k)
        if self.method in ("ngram", "auto"):
            req.ngram = NgramIndex(self.config.ngram_min, self.config.ngram_max)
        if params.structured is not None:
            req.grammar = self.grammars.compile(params.structured).new_state()
        if params.min_tokens:
            req.min_tokens_ban = sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids))
        if self._fault_marker and self._fault_marker in self.tokenizer.decode(ids):
            self._faulty.add(rid)
        return req

    def add_request(self, req: Request) -> None:
        self.scheduler.add(req)
        self.metrics.total_prompt_tokens += len(req.prompt_ids)

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.scheduler.find(request_id)
        if req is None:
            return None
        req.finish("abort")
        out = self._retire(req, [], "", None)
        self._refresh_gauges()
        return out

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        if sched.empty:
            return []
        self.policy.plan(sched.items)
        t0 = time.perf_counter()
        try:
            outputs = self._run(sched)
        except Exception as exc:  # noqa: BLE001 - isolate the request(s) that broke the batch
            outputs = self._isolate_failure(sched, exc)
        self.metrics.total_steps += 1
        self.metrics.total_step_seconds += time.perf_counter() - t0
        self._refresh_gauges()
        return outputs

    def _isolate_failure(self, sched: ScheduledStep, exc: Exception) -> list[RequestOutput]:
        """The batched step failed before its commit, so no request state moved: retry each
        request on its own and fail only those that still fail."""
        if len(sched.items) == 1:
            log.error("request %s failed", sched.items[0].request.request_id, exc_info=exc)
            return [self._fail(sched.items[0].request, exc)]
        outputs = []
        for it in sched.items:
            try:
                outputs += self._run(ScheduledStep([it]))
            except Exception as solo_exc:  # noqa: BLE001 - this request alone is at fault
                log.error("request %s failed", it.request.request_id, exc_info=solo_exc)
                outputs.append(self._fail(it.request, solo_exc))
        return outputs

    def _run(self, sched: ScheduledStep) -> list[RequestOutput]:
        """Propose, score and verify without touching request state; then commit."""
        t0 = time.perf_counter()
        proposal = propose(sched.items, self.drafter)
        t1 = time.perf_counter()
        fwd, verifying = [], []
        for i, (it, d) in enumerate(zip(sched.items, proposal.tokens)):
            r = it.request
            done = it.completes
            fwd.append(ForwardItem(r.slot, r.num_computed, r.all_ids[r.num_computed:r.num_computed + it.num_new] + d,
                                   1 + len(d) if done else 0, num_drafts=len(d)))
            if done:
                verifying.append(i)
        logits = self.target.forward(fwd)
        self._observe_costs(sched, t1 - t0, time.perf_counter() - t1)
        result = None
        if verifying:
            q = proposal.probs
            if q is not None and len(verifying) < len(sched.items):
                q = q[verifying]
            result = self._verify([sched.items[i].request for i in verifying],
                                  [proposal.tokens[i] for i in verifying], q, logits)
        return self._commit_step(sched, proposal, verifying, result, logits)

    def _commit_step(self, sched: ScheduledStep, proposal: Proposal, verifying: list[int],
                     result: VerifyResult | None, logits: torch.Tensor) -> list[RequestOutput]:
        """The one place where a step moves request state: cache cursors, tokens, stops."""
        for i, it in enumerate(sched.items):
            it.request.num_computed += it.num_new
            if proposal.draft_cached is not None and proposal.draft_cached[i] is not None:
                it.request.draft_computed = proposal.draft_cached[i]
        outputs = []
        row = 0
        for b, i in enumerate(verifying):
            req, drafts = sched.items[i].request, proposal.tokens[i]
            n_rows = len(drafts) + 1
            try:
                out = self._commit(req, drafts, sched.items[i].source, result.num_accepted[b],  # type: ignore[union-attr]
                                   result.final_token[b], logits[row:row + n_rows])
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                log.error("request %s failed", req.request_id, exc_info=exc)
                out = self._fail(req, exc)
            row += n_rows
            if out is not None:
                outputs.append(out)
        return outputs

    def _verify(self, reqs: list[Request], drafts: list[list[int]], draft_probs: torch.Tensor | None,
                logits: torch.Tensor):
        dev = logits.device
        k_max = max(len(d) for d in drafts)
        rows = [r.row_params(d[:j]) for r, d in zip(reqs, drafts) for j in range(len(d) + 1)]
        probs = warp(logits, rows)
        if all(r.params.greedy for r in reqs):
            return verify_greedy(probs.argmax(dim=-1), drafts)
        bsz, vocab = len(reqs), probs.shape[1]
        p = probs.new_zeros(bsz, k_max + 1, vocab)
        q = probs.new_zeros(bsz, k_max, vocab)
        tok = torch.zeros(bsz, k_max, dtype=torch.long, device=dev)
        u = torch.zeros(bsz, k_max + 1, device=dev)
        row = 0
        for b, (r, d) in enumerate(zip(reqs, drafts)):
            n = len(d)
            p[b, : n + 1] = probs[row:row + n + 1]
            row += n + 1
            if n:
                tok[b, :n] = torch.tensor(d, device=dev)
                if draft_probs is not None:
                    q[b, :n] = draft_probs[b, :n]
                else:
                    q[b, torch.arange(n), tok[b, :n]] = 1.0
            # Exactly n + 1 draws from the request's own generator: reproducible whatever the batch.
            u[b, : n + 1] = torch.rand(n + 1, generator=r.generator).to(dev)
        num = torch.tensor([len(d) for d in drafts], device=dev)
        u_final = u.gather(1, num[:, None]).squeeze(1)
        return verify(p, q, tok, num, u[:, :k_max], u_final)

    # ------------------------------------------------------------------ commit and stop

    def _commit(self, req: Request, drafts: list[int], source: str | None, accepted: int, final: int,
                logits: torch.Tensor) -> RequestOutput | None:
        if req.request_id in self._faulty:
            raise RuntimeError("fault injected for testing (SPECDEC_FAULT_INJECTION)")
        new = drafts[:accepted] + [final]
        req.num_computed += accepted
        complete = False
        if req.grammar is not None:
            # The grammar state only matters while the request runs: every later cut finishes it.
            new = new[: req.grammar.commit(new)]
            complete = req.grammar.finished
        kept, reason = self._apply_token_stops(req, new)
        text_ids = kept[:-1] if reason == "stop" else kept
        if reason is None and complete:
            reason = "stop"  # the output is complete: nothing but the end could follow
        delta, n_stop = req.detokenizer.add(text_ids)
        if n_stop is not None:
            kept, reason = kept[:n_stop], "stop"
        elif reason is not None:
            delta += req.detokenizer.flush()
        req.all_ids += kept
        req.output_ids += kept
        # Draft-cache entries past the committed tokens belong to rejected drafts.
        req.draft_computed = min(req.draft_computed, req.num_tokens - 1)
        st = req.stats
        st.completion_tokens += len(kept)
        st.verify_steps += 1
        if st.first_token_time is None:
            st.first_token_time = time.monotonic()
        m = self.metrics
        m.total_generation_tokens += len(kept)
        if drafts:
            counted = min(accepted, len(kept))
            st.draft_tokens += len(drafts)
            st.accepted_tokens += counted
            st.record_accepted(counted)
            m.total_draft_tokens += len(drafts)
            m.total_accepted_tokens += counted
            m.draft_tokens_by_source[source] = m.draft_tokens_by_source.get(source, 0) + len(drafts)  # type: ignore[index]
            m.accepted_tokens_by_source[source] = m.accepted_tokens_by_source.get(source, 0) + counted  # type: ignore[index]
            while len(m.accepted_histogram) <= counted:
                m.accepted_histogram.append(0)
            m.accepted_histogram[counted] += 1
            req.acceptance[source].update(accepted, len(drafts))  # type: ignore[index]
        logprobs = self._logprobs(req, logits[: len(kept)], kept) if req.params.logprobs is not None else None
        if reason is not None:
            req.finish(reason)
            return self._retire(req, kept, delta, logprobs)
        return RequestOutput(req.request_id, kept, delta, logprobs=logprobs)

    def _apply_token_stops(self, req: Request, new: list[int]) -> tuple[list[int], str | None]:
        """Cut ``new`` at the first token-level stop: EOS / stop ids, max_tokens, max_model_len."""
        p = req.params
        for i, t in enumerate(new):
            if t in p.stop_token_ids or (not p.ignore_eos and t in self.eos_ids):
                return new[: i + 1], "stop"
            if len(req.output_ids) + i + 1 >= p.max_tokens or req.num_tokens + i + 1 >= self.max_model_len:
                return new[: i + 1], "length"
        return new, None

    def _logprobs(self, req: Request, logits: torch.Tensor, tokens: list[int]) -> list[TokenLogprob]:
        """The target's raw log-probabilities, from the verification pass (no extra forward)."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        n_top = req.params.logprobs or 0
        chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None]).squeeze(1).tolist()
        top_v, top_i = lp.topk(n_top, dim=-1) if n_top else (lp[:, :0], lp[:, :0].long())
        return [TokenLogprob(t, c, list(zip(ti, tv))) for t, c, ti, tv in
                zip(tokens, chosen, top_i.tolist(), top_v.tolist())]

    def _retire(self, req: Request, kept: list[int], delta: str, logprobs) -> RequestOutput:
        self.scheduler.remove(req)
        self._faulty.discard(req.request_id)
        self.metrics.total_finished += 1
        return RequestOutput(req.request_id, kept, delta, finished=True, finish_reason=req.finish_reason,
                             logprobs=logprobs, error=req.error, stats=req.stats)

    def _fail(self, req: Request, exc: Exception) -> RequestOutput:
        self.metrics.total_failed += 1
        req.finish("error", error=f"internal error while processing the request: {type(exc).__name__}")
        return self._retire(req, [], "", None)

    # ------------------------------------------------------------------ step costs

    def _measure_costs(self) -> StepCostModel:
        """Time the step shapes this engine can produce (see ``cost_model``); without adaptive
        speculation nothing reads them. With speculation off it still runs (target only, a few
        seconds): its forwards over every batch shape are the warm-up that makes the first full
        batch as fast as the later ones (measured: a server that skipped it decoded 16 requests
        15% slower for the whole run, the allocator's state after large frees being the likely
        cause)."""
        if not self.config.adaptive_speculation:
            return StepCostModel.constant(self.draft_runner is not None)
        with phase(log, "calibrating: timing target and draft steps for the speculation policy"):
            return calibrate(self.target, self.draft_runner, self.config.max_num_seqs,
                             1 + self.num_speculative_tokens, self.max_model_len)

    def _observe_costs(self, sched: ScheduledStep, draft_s: float, target_s: float) -> None:
        """Account the step's time, and let decode-only steps correct the live cost model."""
        self.metrics.total_draft_seconds += draft_s
        self.metrics.total_target_seconds += target_s
        if any(it.num_new != 1 for it in sched.items):
            return  # prefill chunks: not a shape the cost model describes
        self.costs.observe_target(sum(1 + it.num_drafts for it in sched.items), target_s)
        drafting = [it for it in sched.items if it.source == "draft"]
        depth = max((it.num_drafts for it in drafting), default=0)
        # A draft cache that lagged (the request used n-gram lookups meanwhile) is caught up in
        # this step's first draft forward: a prefill, not a shape the draft table describes.
        caught_up = max((it.request.num_computed + it.num_new - it.request.draft_computed for it in drafting), default=0)
        if depth and caught_up <= 1 + self.num_speculative_tokens:
            self.costs.observe_draft([sum(1 for it in sched.items if it.source == "draft" and it.num_drafts >= j)
                                      for j in range(1, depth + 1)], draft_s)

    def _refresh_gauges(self) -> None:
        m, s = self.metrics, self.scheduler
        m.num_running, m.num_waiting, m.kv_cache_usage = len(s.running), len(s.waiting), s.kv_usage

    # ------------------------------------------------------------------ offline helper

    def generate(self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]) -> list[Completion]:
        """Run prompts to completion (all submitted at once) and return them in order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.make_request(p, sp) for p, sp in zip(prompts, plist)]
        for r in reqs:
            self.add_request(r)
        while self.has_unfinished():
            self.step()
        return [Completion(r.request_id, r.output_ids, r.detokenizer.emitted, r.finish_reason, r.stats) for r in reqs]


def _lookup(req: Request, k: int) -> list[int]:
    """Prompt-lookup drafts for ``req``, cut where its grammar (if any) would reject them: a draft
    the target can never accept only costs verification rows."""
    tokens = req.ngram.lookup(req.all_ids, k) if req.ngram else []
    if tokens and req.grammar is not None:
        tokens = tokens[: req.grammar.valid_prefix(tokens)]
    return tokens
