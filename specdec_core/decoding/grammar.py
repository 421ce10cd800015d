"""Grammar-constrained decoding with llguidance: compile a ``StructuredOutput`` once, then track
each request's grammar state and hand out the token masks its rows are warped with.

Why llguidance (measured on this 2-core CPU, Qwen2.5 tokenizer of 151,936 tokens, a nested JSON
schema, 49 tokens of output): compile 2 ms (xgrammar 13 ms), mask 25 us median / 2.1 ms worst per
token (xgrammar 2 us / 0.13 ms), both negligible beside a 50 ms step; it installs as one wheel with
no dependencies (xgrammar pulls triton and a TVM runtime), takes Lark grammars that embed JSON
schemas (tool calls) and names special tokens, and its matcher rolls back, which speculation needs.

Speculation stays lossless with respect to the *constrained* target: a row's mask depends only on
the request's committed tokens plus the drafts before that row, the draft model's q and the
target's p are masked by the same mask (``Request.row_params``), and the matcher is advanced only
by committed tokens. Drafts are pushed into the matcher while masks are computed and rolled back
before the commit (``GrammarState.commit``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from copy import copy
from typing import Any

import torch

from specdec_core.decoding.finite_schema import has_finite_value
from specdec_core.decoding.structured_output import StructuredOutput

# Whitespace between JSON tokens: up to 32 characters (indented output up to depth ~7), never
# unbounded: a model that likes newlines must not fill its budget with them.
log = logging.getLogger(__name__)

JSON_OPTIONS: Any = {"whitespace_pattern": r"[ \t\n]{0,32}"}  # llguidance.JsonCompileOptions (a TypedDict)
CACHE_SIZE = 64
# llguidance's view of a tokenizer, per (tokenizer object, vocabulary size, EOS): engines built over
# the same loaded tokenizer (tests, an engine rebuilt in one process) share it instead of rebuilding
# it (~1 s for 49k tokens). The weak reference keeps a recycled ``id`` from matching a new tokenizer.
_LL_TOKENIZERS: dict[tuple[int, int, int], tuple[weakref.ref, Any]] = {}
_LL_LOCK = threading.Lock()


def _ll_tokenizer(hf_tokenizer: Any, n_vocab: int, eos: int) -> Any:
    import llguidance

    key = (id(hf_tokenizer), n_vocab, eos)
    with _LL_LOCK:
        for stale in [k for k, (ref, _) in _LL_TOKENIZERS.items() if ref() is None]:
            del _LL_TOKENIZERS[stale]
        entry = _LL_TOKENIZERS.get(key)
        if entry is not None and entry[0]() is hf_tokenizer:
            return entry[1]
        built = llguidance.LLTokenizer(_backend_json(hf_tokenizer), n_vocab=n_vocab, eos_token=eos)
        _LL_TOKENIZERS[key] = (weakref.ref(hf_tokenizer), built)
        return built


def _backend_json(hf_tokenizer: Any) -> str:
    """The tokenizers-library JSON llguidance builds its view from, without padding or truncation.

    ``llguidance.hf.from_tokenizer`` does the same but always through a copy of the backend, which
    for Gemma 3's 262k-token vocabulary is a JSON round trip of 1.7 s; the copy is needed only
    where padding or truncation is set."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("structured output needs a fast (tokenizers-backed) tokenizer")
    if backend.padding is not None or backend.truncation is not None:
        backend = copy(backend)
        backend.no_padding()
        backend.no_truncation()
    return backend.to_str()


class GrammarCompiler:
    """Compiles specs against one tokenizer; safe to call from any thread.

    The llguidance view of the tokenizer is built once (1.8 s for Qwen's 151k tokens): in the
    background from ``warm``, else on first use. Compiled grammars are kept in a
    small LRU keyed by the spec: the route compiles (and so validates) off the event loop, and the
    engine's ``make_request`` then copies the cached matcher in microseconds.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: set[int]) -> None:
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._tried = False  # ``build`` ran (a failure is the first constrained request's to report)
        self._cache: OrderedDict[str, Any] = OrderedDict()

    @property
    def owed(self) -> bool:
        """llguidance's view of the tokenizer is still to be built (``build`` or ``warm``)."""
        return bool(self.eos_ids) and not self._tried and self._ll_tokenizer is None

    def warm(self) -> None:
        """Start building llguidance's view of the tokenizer on a background thread (an engine
        that is not a server's; a server's ``build``s it while idle, after its ready line).

        Built lazily, it stalled the first constrained request's event loop (1.0-1.3 s for Qwen's
        151k tokens). llguidance holds the GIL for the whole build (2.5-3.5 s for Gemma 3's 262k
        tokens on the 2-core machine): built before a server is ready, it delayed every start by
        that much. A request arriving meanwhile waits for it; ``compile`` waits for the build.
        """
        if self.eos_ids:
            threading.Thread(target=self.build, name="specdec-grammar-warm", daemon=True).start()

    def build(self) -> None:
        """Build llguidance's view of the tokenizer on this thread."""
        self._tried = True
        try:
            self._tokenizer()
        except (ValueError, RuntimeError, TypeError) as exc:  # the first constrained request reports it
            log.warning("structured output is not available for this tokenizer: %s", exc)

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                eos = getattr(self.hf_tokenizer, "eos_token_id", None)
                if eos not in self.eos_ids:
                    eos = self.eos_ids[0]
                self._ll_tokenizer = _ll_tokenizer(self.hf_tokenizer, self.ll_vocab_size, eos)
            return self._ll_tokenizer

    @property
    def ll_vocab_size(self) -> int:
        return max(self.vocab_size, len(self.hf_tokenizer))

    @property
    def ll_eos(self) -> int:
        return self._tokenizer().eos_token

    def compile(self, spec: StructuredOutput) -> "CompiledGrammar":
        """The compiled grammar, or ``ValueError`` saying why the spec cannot be compiled."""
        import llguidance

        if not self.eos_ids:
            raise ValueError("structured output needs a model with an end-of-sequence token")
        key = spec.cache_key
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return CompiledGrammar(self._cache[key], self)
        if spec.json_schema is not None and not has_finite_value(spec.json_schema):  # decoded forever
            raise ValueError("is a schema no finite JSON value matches: a required property or item refers back "
                             "to its own schema with no way to end (make it optional, or offer an alternative)")
        tokenizer = self._tokenizer()
        try:
            if spec.lark is not None:
                grammar = llguidance.LLMatcher.grammar_from_lark(spec.lark)
            else:
                schema = spec.json_schema if spec.json_schema is not None else {"type": "object"}
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise ValueError(f"cannot compile: {exc}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise ValueError(f"cannot compile: {error.strip()}")
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(f"cannot compile: {matcher.get_error().strip()}")
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return CompiledGrammar(matcher, self)


class CompiledGrammar:
    """A compiled grammar in its start state; ``new_state`` gives each request its own matcher."""

    def __init__(self, matcher: Any, compiler: GrammarCompiler) -> None:
        self._matcher = matcher
        self._compiler = compiler

    def new_state(self) -> "GrammarState":
        return GrammarState(self._matcher.deep_copy(), self._compiler)


class GrammarState:
    """One request's grammar state. Engine thread only.

    ``_committed`` stands at the committed tokens and only ``commit`` advances it. Drafts go into a
    scratch copy (``deep_copy`` costs 1.5 us): ``mask(drafts)`` moves the scratch to the committed
    tokens plus ``drafts`` and returns the allowed tokens there, cached per position until the drafts
    change. Nothing is ever rolled back in the matcher itself: llguidance 1.9.1's ``rollback`` left
    a wrong state after a token that completed the grammar behind a one-token mask (mask, consume
    t3, mask = {t8}, consume t8, rollback 2, consume t2 -> refused), which the distribution test
    found; a copy is exact by construction.
    """

    def __init__(self, matcher: Any, compiler: GrammarCompiler) -> None:
        self._committed = matcher
        self._scratch: Any = None  # a copy at the committed tokens plus ``_pending``
        self._pending: list[int] = []
        self._masks: dict[int, torch.Tensor] = {}
        self._vocab = compiler.vocab_size
        self._eos_ids = compiler.eos_ids
        self._ll_eos = compiler.ll_eos
        self._bits = torch.full((1, (compiler.ll_vocab_size + 31) // 32), -1, dtype=torch.int32)  # 32 tokens a word
        self._shifts = torch.arange(32, dtype=torch.int32)

    @property
    def vocab_size(self) -> int:
        """The length of the masks it hands out."""
        return self._vocab

    @property
    def finished(self) -> bool:
        """The committed text is complete: the grammar allows nothing but the end."""
        return self._committed.is_stopped()

    def mask(self, drafts: list[int]) -> torch.Tensor:
        """Bool ``[vocab]``: the tokens allowed after the committed tokens plus ``drafts``."""
        self._move_to(drafts)
        at = len(drafts)
        if at not in self._masks:
            self._masks[at] = self._compute_mask(self._scratch if drafts else self._committed)
        return self._masks[at]

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` (after the committed ones) the grammar accepts in a row."""
        return self._committed.validate_tokens([self._ll_token(t) for t in tokens])

    def commit(self, tokens: list[int]) -> int:
        """Drop the drafts and advance by the tokens the step produced; returns how many of them
        to keep: none after the one that completed the grammar (only the end could follow, and a
        request stops there whether or not it drafted that end)."""
        self._scratch, self._pending, self._masks = None, [], {}
        for i, t in enumerate(tokens):
            if not self._committed.consume_token(self._ll_token(t)):
                raise RuntimeError(f"token {t} violates the grammar: {self._committed.get_error()}")
            if self._committed.is_stopped():
                return i + 1
        return len(tokens)

    # ------------------------------------------------------------------ internals

    def _move_to(self, drafts: list[int]) -> None:
        common = 0
        while common < min(len(drafts), len(self._pending)) and drafts[common] == self._pending[common]:
            common += 1
        if common < len(self._pending):  # the drafts changed: replay the common part on a fresh copy
            self._masks = {at: m for at, m in self._masks.items() if at <= common}
            self._scratch, self._pending = None, []
            self._consume(drafts[:common])
        self._consume(drafts[len(self._pending):])

    def _consume(self, drafts: list[int]) -> None:
        if drafts and self._scratch is None:
            self._scratch = self._committed.deep_copy()
        for t in drafts:
            self._pending.append(t)
            if self._scratch.is_stopped():
                continue  # a draft past the end: the rows after it allow only the end
            if not self._scratch.consume_token(self._ll_token(t)):
                raise RuntimeError(f"draft token {t} violates the grammar: {self._scratch.get_error()}")

    def _ll_token(self, token: int) -> int:
        """Every EOS id of the engine is llguidance's one EOS token."""
        return self._ll_eos if token in self._eos_ids else token

    def _compute_mask(self, matcher: Any) -> torch.Tensor:
        if matcher.is_stopped():
            allowed = torch.zeros(self._vocab, dtype=torch.bool)
        else:
            matcher.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * 4)
            allowed = ((self._bits[0, :, None] >> self._shifts) & 1).bool().flatten()[: self._vocab]
        if matcher.is_stopped() or allowed[self._ll_eos]:
            allowed[self._eos_ids] = True
        return allowed
