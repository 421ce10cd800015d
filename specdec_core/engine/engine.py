"""The synchronous engine: one ``step()`` drafts, verifies and commits for every running request.

A step, for the requests the scheduler picked (``step`` names each phase):
  schedule: who runs and how much of whose prompt is prefilled (``Scheduler``);
  plan:     per request, a proposer (draft model, n-gram or suffix lookup) and how many drafts (0..k)
            make the step's committed tokens per second highest, from measured costs;
  propose:  the proposers draft (one batched draft-model forward per draft position) and mirror
            prefill chunks into the draft model's cache;
  forward:  one packed target forward scores every request's last token + drafts, and prefill chunks;
  verify:   one vectorised verification decides, for all requests at once, how many drafts
            survive and which token follows them;
  commit:   tokens are appended, stop conditions checked, caches rolled back by length.
Everything here runs on the engine thread; ``AsyncEngine`` is the thread-safe facade.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass

import torch

from specdec_core.decoding.detokenizer import IncrementalDetokenizer
from specdec_core.decoding.eos import eos_token_ids
from specdec_core.decoding.grammar import CompiledGrammar, GrammarCompiler
from specdec_core.decoding.logprobs import token_logprobs
from specdec_core.decoding.sampling_params import SamplingParams, outside_vocab
from specdec_core.decoding.structured_output import StructuredOutput
from specdec_core.engine.block_pool import BlockPool
from specdec_core.engine.config import EngineConfig, speculation_method
from specdec_core.engine.deferred_startup import DeferredStartup
from specdec_core.engine.kv_sizing import size_for
from specdec_core.engine.outputs import RequestOutput, RequestStats
from specdec_core.engine.provenance import TARGET, TextProvenance, token_sources
from specdec_core.engine.request import Request
from specdec_core.engine.scheduler import Scheduler
from specdec_core.engine.speculative_step import SpeculativeStep, StepOutcome
from specdec_core.engine.startup_costs import step_costs
from specdec_core.engine.stats import EngineMetrics
from specdec_core.engine.step_plan import ScheduledRequest, ScheduledStep
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.model_runner import ModelRunner
from specdec_core.loading.draft_vocab import frequent_token_ids
from specdec_core.loading.progress_log import phase
from specdec_core.speculation.acceptance import Source
from specdec_core.speculation.draft_model import DraftModelProposer
from specdec_core.speculation.ngram import NgramProposer
from specdec_core.speculation.policy import LookupProposer, SpeculationPolicy
from specdec_core.speculation.suffix import SuffixProposer

log = logging.getLogger("specdec.engine")


@dataclass
class Completion:
    """Result of the offline ``Engine.generate`` helper."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stats: RequestStats


def _profile(config: EngineConfig, model: HFModule | None = None) -> DeviceProfile:
    """The device profile of ``config``'s flags; for models already loaded, on their device and dtype."""
    flags = (config.quantize, config.attention, config.decode_graphs, config.kernels)
    return DeviceProfile.decide(config.device, config.dtype, *flags) if model is None else DeviceProfile.of_model(model, *flags)


class Engine:
    """Owns the models, caches, scheduler and proposers. Not thread-safe: drive it from one thread."""

    def __init__(self, config: EngineConfig, progress: bool = True, work_when_idle: bool = False) -> None:
        """``work_when_idle``: start-up work a server can do after its ready line is left to
        ``deferred`` (``engine.deferred_startup``), which its loop runs while idle."""
        from specdec_core.loading.loader import load_model

        # Every per-device choice, made (and a bad combination refused) before any model loads.
        profile = _profile(config)
        # The embedded default (no --model) is a pair: it always has a draft model.
        has_draft = config.draft_model is not None or config.model is None
        method = speculation_method(config.speculative_method, has_draft)
        target = load_model(config.model, role="target", profile=profile, cache_dir=config.cache_dir, progress=progress)
        draft = None
        if method in ("draft", "auto") and has_draft:
            draft = load_model(config.draft_model, role="draft", profile=profile, cache_dir=config.cache_dir,
                               progress=progress)
        self._setup(config, profile, target, draft, method, owns_models=True, work_when_idle=work_when_idle)

    @classmethod
    def from_loaded(cls, config: EngineConfig, target, draft=None, work_when_idle: bool = False) -> "Engine":
        """Build an engine around already loaded models (``LoadedModel``), e.g. to share them."""
        engine = cls.__new__(cls)
        method = speculation_method(config.speculative_method, draft is not None)
        profile = _profile(config, target.model)
        engine._setup(config, profile, target, draft if method in ("draft", "auto") else None, method,
                      work_when_idle=work_when_idle)
        return engine

    def _setup(self, config: EngineConfig, profile: DeviceProfile, target, draft, method: str,
               owns_models: bool = False, work_when_idle: bool = False) -> None:
        from specdec_core.loading.tokenizer_compat import check_pair, output_vocab_size

        self.config = config
        self.tokenizer = target.tokenizer
        self.model_name = target.name
        self.method = method
        vocab = check_pair(target, draft) if draft is not None else min(
            len(target.tokenizer), output_vocab_size(target.model))
        self.vocab_size = vocab
        self.num_speculative_tokens = 0 if method == "none" else config.num_speculative_tokens
        self.eos_ids = eos_token_ids(target.model, target.tokenizer)
        self.profile = profile
        self.kv = size_for(config, [target.model] + ([draft.model] if draft is not None else []), profile.device,
                           self.num_speculative_tokens)
        self.max_model_len = config.max_model_len = self.kv.max_model_len
        log.info("%s", profile.describe())
        log.info("%s", self.kv.describe())
        buckets = (config.max_num_seqs, self.num_speculative_tokens + 1) if profile.decode_graphs else None

        def runner(model: HFModule, head_rows: list[int] | None = None) -> ModelRunner:
            return ModelRunner(model, self.kv.num_blocks, self.kv.block_size, self.max_model_len, vocab, profile,
                               release_weights=owns_models, head_rows=head_rows, graph_buckets=buckets)

        with phase(log, f"preparing {profile.kernels} kernels for the target model"):
            self.target = runner(target.model)
        if config.decode_graphs == "on" and self.target.graphs is None:
            raise ValueError("--decode-graphs on needs a model on the native path (decoder_families)")
        self.draft_runner = None
        if draft is not None:
            head = frequent_token_ids(self.tokenizer, config.draft_vocab_size, vocab, self.eos_ids)
            with phase(log, f"preparing {profile.kernels} kernels for the draft model"):
                self.draft_runner = runner(draft.model, head)
        runners = (("target", self.target), ("draft", self.draft_runner)) if profile.capture_graphs else ()
        for role, r in ((n, x) for n, x in runners if x is not None):
            with phase(log, f"capturing the {role} model's decode graphs up to {config.graph_capture_len} keys"):
                r.capture_graphs(config.graph_capture_len)  # after every KV cache is allocated
        self.drafter = DraftModelProposer(self.draft_runner) if self.draft_runner is not None else None
        self.ngram = NgramProposer(config.ngram_min, config.ngram_max) if method in ("ngram", "auto") else None
        self.suffix = SuffixProposer(config.suffix_depth, config.suffix_cache_tokens,
                                     trees=config.suffix_trees and self.target.supports_trees
                                     ) if method in ("suffix", "auto") else None
        found: tuple[tuple[Source, LookupProposer | None], ...] = (("ngram", self.ngram), ("suffix", self.suffix))
        lookups: dict[Source, LookupProposer] = {source: p for source, p in found if p is not None}
        self.speculative_step = SpeculativeStep(self.target, self.drafter)
        log.info("execution: target on the %s path, draft %s%s", self.target.path,
                 f"on the {self.draft_runner.path} path" if self.draft_runner else "none",
                 "; no decode graphs (not the native path)" if profile.decode_graphs and self.target.graphs is None else "")
        self.scheduler = Scheduler(config.max_num_seqs, config.prefill_chunk_size, BlockPool(self.kv.num_blocks),
                                   self.kv.block_size, config.enable_prefix_caching,
                                   share_outputs=all(r.rows_alone for r in (self.target, self.draft_runner) if r))
        self.metrics = EngineMetrics()
        self._seed_rng = random.Random(config.seed if config.seed is not None else time.time_ns())  # unseeded requests'
        self._request_numbers = itertools.count()  # ids of requests that come without one
        self.step_costs = step_costs(config, self.target, self.draft_runner, target, draft, profile,
                                     1 + self.num_speculative_tokens, self.scheduler if work_when_idle else None)
        self.grammars = GrammarCompiler(self.tokenizer, vocab, self.eos_ids)
        self.deferred = DeferredStartup(self.scheduler, self.step_costs, self.grammars, work_when_idle)
        self.policy = SpeculationPolicy(method, self.step_costs.costs, config.adaptive_speculation, self.max_model_len, lookups,
                                        has_draft=self.drafter is not None)

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
        bad = outside_vocab(self.vocab_size, {"prompt": ids if not isinstance(prompt, str) else (),
                                              "stop_token_ids": params.stop_token_ids, "logit_bias": params.logit_bias})
        if bad is not None:
            raise ValueError(f"{bad[0]} token ids must be integers in [0, {self.vocab_size}); got {bad[1]!r}")
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}; "
                             "it must leave room for at least one generated token")
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(62)
        k = self.num_speculative_tokens
        if params.num_speculative_tokens is not None:
            k = min(k, params.num_speculative_tokens)
        if params.max_tokens == 0:
            k = 0  # the prompt is only scored: nothing to draft for
        ban = sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)) if params.min_tokens else []
        return Request(
            request_id or f"req-{next(self._request_numbers)}", ids, params, random.Random(seed),
            IncrementalDetokenizer(self.tokenizer, params.stop), k,
            ngram=self.ngram.new_index() if self.ngram is not None else None,
            suffix=self.suffix.new_index() if self.suffix is not None else None,
            grammar=self.grammars.compile(params.structured).new_state() if params.structured is not None else None,
            min_tokens_ban=ban,
            provenance=TextProvenance() if params.provenance else None,
        )

    def add_request(self, req: Request) -> None:
        self.scheduler.add(req)
        self.metrics.total_prompt_tokens += len(req.prompt_ids)

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.scheduler.find(request_id)
        if req is None:
            return None
        req.finish("abort")
        out = self._retire(req)
        self._refresh_gauges()
        return out

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()                                    # schedule
        self._copy_prefixes(plan)
        if plan.empty:
            return []
        self.policy.plan(plan.items)                                        # plan
        t0 = time.perf_counter()
        try:
            outputs = self._run(plan, whole=True)                           # propose .. commit
        except Exception as exc:  # noqa: BLE001 - isolate the request(s) that broke the batch
            outputs = self._isolate_failure(plan, exc)
        self.metrics.total_steps += 1
        self.metrics.total_step_seconds += time.perf_counter() - t0
        self._refresh_gauges()
        return outputs

    def _run(self, plan: ScheduledStep, *, whole: bool) -> list[RequestOutput]:
        """Propose, score and verify without touching request state; then commit. Only a ``whole``
        step (as scheduled) teaches the cost model, before the commit moves the tokens it prices:
        a bisected step's halves are shapes never scheduled, up to 2*log2(N) for one failure."""
        outcome = self.speculative_step.run(plan.items)                      # propose, forward, verify
        self.metrics.record_step(outcome.draft_seconds, outcome.target_seconds, *outcome.tree_counts)
        if whole:
            self.step_costs.observe(plan.items, outcome.draft_seconds, outcome.target_seconds,
                                    1 + self.num_speculative_tokens)
        return self._commit_step(plan, outcome)                               # commit

    def _copy_prefixes(self, plan: ScheduledStep) -> None:
        """Cached prompt chunks the scheduler handed to admitted requests, copied between blocks."""
        for c in plan.copies:
            self.target.cache.copy_blocks(c.src, c.dst)
            if self.draft_runner is not None and c.draft:
                self.draft_runner.cache.copy_blocks(c.src, c.dst)
        self.metrics.prefix_cache_hit_tokens += plan.cached_tokens

    def _isolate_failure(self, plan: ScheduledStep, exc: Exception) -> list[RequestOutput]:
        """The batched step failed before its commit, so no request state moved: bisect. Each half
        runs on its own; a half that passes is committed, a half that fails is split again, until
        the request that fails alone is failed. One culprit among N costs 2*log2(N) smaller
        forwards, where re-running every request alone cost N full ones (4 bad clients slowed 4
        good ones from 1.2 s to 10.8 s); a failure of the batch as a whole costs two. The culprit
        leaves the scheduler, so the next step runs the others batched again."""
        items = plan.items
        if len(items) == 1:
            log.error("request %s failed", items[0].request.request_id, exc_info=exc)
            return [self._fail(items[0].request, exc)]
        outputs = []
        mid = len(items) // 2
        for half in (ScheduledStep(items[:mid]), ScheduledStep(items[mid:])):
            try:
                outputs += self._run(half, whole=False)
            except Exception as half_exc:  # noqa: BLE001 - the culprit is in this half
                outputs += self._isolate_failure(half, half_exc)
        return outputs

    # ------------------------------------------------------------------ commit and stop

    def _commit_step(self, plan: ScheduledStep, outcome: StepOutcome) -> list[RequestOutput]:
        """Where a step moves running requests' state (cache cursors, tokens, stops); admission
        and blocks are the scheduler's."""
        outputs = []
        for it, o in zip(plan.items, outcome.items, strict=True):
            if it.prompt_rows and outcome.prompt_logits is not None:
                try:
                    self._score_prompt(it.request, outcome.prompt_logits, o.prompt_start, it.prompt_rows)
                except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                    log.error("request %s failed", it.request.request_id, exc_info=exc)
                    outputs.append(self._fail(it.request, exc))
                    continue
            it.request.num_computed += it.num_new
            if o.draft_cached is not None:
                it.request.draft_computed = o.draft_cached
            self.scheduler.record_cached(it.request)
            if o.accepted is None or o.final is None:
                continue  # still in prefill
            it.request.commit_draws(o.stream)
            scores = outcome.logits
            if it.request.params.logprobs_mode == "processed_logprobs" and outcome.processed is not None:
                scores = outcome.processed
            try:
                out = self._commit(it, o.drafts, o.accepted, o.final, scores[o.row_start:o.row_start + len(o.drafts) + 1])
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                log.error("request %s failed", it.request.request_id, exc_info=exc)
                out = self._fail(it.request, exc)
            if out is not None:
                outputs.append(out)
        return outputs

    def _commit(self, it: ScheduledRequest[Request], drafts: list[int], accepted: int, final: int,
                logits: torch.Tensor) -> RequestOutput | None:
        req, source, new = it.request, it.source, drafts[:accepted] + [final]
        req.learn(source, accepted, len(drafts), it.lookups, new)
        self.policy.learn(it, new)
        req.num_computed += accepted
        complete = False
        if req.grammar is not None:
            # The grammar state only matters while the request runs: every later cut finishes it.
            new = new[: req.grammar.commit(new)]
            complete = req.grammar.finished
        kept, reason = req.token_stop(new, self.eos_ids, self.max_model_len)
        text_ids = kept[:-1] if reason == "stop" else kept
        if reason is None and complete:
            reason = "stop"  # the output is complete: nothing but the end could follow
        sources = token_sources(len(kept), accepted, source)
        delta, n_stop, pieces = req.add_text(text_ids, sources)
        if n_stop is not None:
            kept, reason = kept[:n_stop], "stop"
        elif reason is not None:
            rest, rest_pieces = req.flush_text(sources[len(text_ids) - 1] if text_ids else TARGET)
            delta += rest
            if pieces is not None and rest_pieces is not None:
                pieces += rest_pieces
        sources = sources[:len(kept)]
        req.all_ids += kept
        req.output_ids += kept
        # Draft-cache entries past the committed tokens belong to rejected drafts.
        req.draft_computed = min(req.draft_computed, req.num_tokens - 1)
        counted = min(accepted, len(kept))
        req.stats.record_verify(len(kept), len(drafts), counted)
        if req.stats.first_token_time is None:
            req.stats.first_token_time = time.monotonic()
        self.metrics.total_generation_tokens += len(kept)
        if drafts and source is not None:
            self.metrics.record_verify(source, len(drafts), counted)
        logprobs = token_logprobs(logits[: len(kept)], kept, req.params.logprobs or 0) if req.params.logprobs is not None else None
        out = RequestOutput(req.request_id, kept, delta, logprobs=logprobs, sources=sources, provenance=pieces)
        if reason is not None:
            req.finish(reason)
            return self._retire(req, out)
        out.prompt_logprobs = req.take_prompt_logprobs()
        return out

    def _score_prompt(self, req: Request, logits: torch.Tensor, start: int, rows: int) -> None:
        """Prompt log-probabilities from the rows this step's prefill computed for ``req``: row i
        (position ``num_computed + i``) scores the prompt token after it. Raw, whatever the
        ``logprobs_mode``: no sampling rule applies to tokens that were given. Rows a preempted
        request computes again were scored before it was preempted: they are skipped."""
        s = req.num_computed
        skip = min(max(len(req.prompt_logprobs) - s, 0), rows)
        req.prompt_logprobs += token_logprobs(logits[start + skip:start + rows], req.all_ids[s + 1 + skip:s + 1 + rows],
                                              req.params.prompt_logprobs or 0, ranks=True)

    def _retire(self, req: Request, out: RequestOutput | None = None) -> RequestOutput:
        """Remove a finished request; its last delta is ``out`` (with nothing in it by default)."""
        self.scheduler.remove(req)
        if self.suffix is not None:
            self.suffix.retire(req)
        self.metrics.total_finished += 1
        if out is None:
            out = RequestOutput(req.request_id, [], "")
        out.finished, out.finish_reason, out.error, out.stats = True, req.finish_reason, req.error, req.stats
        if req.finish_reason in ("stop", "length"):
            out.prompt_logprobs = req.take_prompt_logprobs()
        return out

    def _fail(self, req: Request, exc: Exception) -> RequestOutput:
        self.metrics.total_failed += 1
        req.finish("error", error=f"internal error while processing the request: {type(exc).__name__}")
        return self._retire(req)

    def _refresh_gauges(self) -> None:
        m, s = self.metrics, self.scheduler
        m.num_running, m.num_waiting, m.kv_cache_usage = len(s.running), len(s.waiting), s.kv_usage
        m.num_preemptions = s.num_preemptions

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
