"""Runs one model over a ragged batch: many requests, each with its own cached prefix and its own
number of new tokens, packed into a single sequence so no compute is spent on padding.

Two execution paths, chosen per model at start-up (``ModelRunner.path``):

- ``native`` (Llama, Qwen2, Mistral, SmolLM2): specdec's own forward (``native_llama``). Batch
  invariant: a request's logits are bit-identical whatever else is in the forward, and verifying
  drafts gives the logits plain decoding would give.
- ``transformers`` (every other ``AutoModelForCausalLM`` whose attention writes through
  ``past_key_values.update`` and accepts a 4-D mask): the model's own forward over one packed
  sequence under a block-causal mask. Its linear layers are prepared like the native ones, but a
  query's attention reduces over the whole packed batch, so rows may differ in the last bits with
  the batch: speculation stays lossless in distribution, greedy output can differ at near-ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_core.execution.gguf_weights import attach_block_weights, detach_block_weights, prepare_block_linears
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.kv_cache import PackedLayout, SlotKVCache
from specdec_core.execution.linear_kernels import Quantize, prepare_linears
from specdec_core.execution.native_llama import Batch, NativeLlama, Segment, supports_native


@dataclass
class ForwardItem:
    """One request's part of a batched forward.

    ``start`` is how many of its tokens are already cached; ``tokens`` are fed at positions
    ``start..start+len(tokens)-1``; logits are returned for the last ``num_logits`` of them. The
    last ``num_drafts`` tokens are speculative: each is attended on its own, exactly as if it were
    decoded alone (see ``native_llama``).
    """

    slot: int
    start: int
    tokens: list[int]
    num_logits: int
    num_drafts: int = 0


class ModelRunner:
    """Owns a model and its KV cache; turns ragged batches into one packed forward."""

    def __init__(self, model: HFModule, num_slots: int, max_len: int, vocab_size: int,
                 quantize: Quantize = "none", release_weights: bool = False,
                 head_rows: list[int] | None = None) -> None:
        """``release_weights``: the runner owns ``model`` and may free the original weights it
        has copied into prepared kernels (halves peak memory); leave it off for shared models.
        ``head_rows``: score only these token ids (``draft_vocab``); every other logit is -inf,
        so whatever is sampled from the logits has probability 0 outside them."""
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        param = next(model.parameters())
        self.device = param.device
        # int8 keeps fp32 activations; the cache follows the activation dtype.
        self.dtype = param.dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.cache = SlotKVCache(
            cfg.num_hidden_layers, num_slots, kv_heads, head_dim, max_len, self.dtype, self.device
        )
        self.vocab_size = vocab_size
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.native: NativeLlama | None = None
        # gguf: the linears of a model converted from a GGUF file get the file's blocks while preparing
        self.block_layers = attach_block_weights(model) if quantize == "gguf" else 0
        try:
            self._prepare(model, quantize, max_len, release_weights, head_rows)
        finally:
            detach_block_weights(model)

    def _prepare(self, model: HFModule, quantize: Quantize, max_len: int, release_weights: bool,
                 head_rows: list[int] | None) -> None:
        if supports_native(model, max_len):
            self.native = NativeLlama(model, quantize, max_len, release=release_weights, head_rows=head_rows)
            self.path = "native"
        else:
            if head_rows:
                raise ValueError("a reduced draft vocabulary needs the native (Llama-family) path")
            if quantize == "gguf":
                prepare_block_linears(model)
            prepare_linears(model, quantize)
            self.body = model.base_model
            self.lm_head = model.get_output_embeddings()
            self.path = "transformers"

    def forward(self, items: list[ForwardItem]) -> torch.Tensor:
        """Return float32 logits ``[sum(num_logits), vocab_size]`` in item order."""
        if self.native is not None:
            logits = self.native(self._native_batch(items), self.cache)
            rows = self.native.head_rows
            if rows is None:
                return logits[:, : self.vocab_size]
            full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
            full[:, rows] = logits
            return full
        return self._packed_forward(items)

    def _native_batch(self, items: list[ForwardItem]) -> Batch:
        """Tokens, positions, cache rows, attention segments and logit rows of one forward."""
        max_len = self.cache.max_len
        ids: list[int] = []
        pos: list[int] = []
        write: list[int] = []
        logit_rows: list[int] = []
        segments: list[Segment] = []
        for it in items:
            n, base, row = len(it.tokens), it.slot * max_len, len(ids)
            known = n - it.num_drafts
            ids += it.tokens
            pos += range(it.start, it.start + n)
            write += range(base + it.start, base + it.start + n)
            logit_rows += range(row + n - it.num_logits, row + n)
            mask = None
            if known > 1:
                q_pos = torch.arange(it.start, it.start + known, device=self.device)
                mask = torch.arange(it.start + known, device=self.device)[None, :] <= q_pos[:, None]
            segments.append(Segment(row, known, base, it.start + known, mask))
            segments += [Segment(row + known + j, 1, base, it.start + known + j + 1, None) for j in range(it.num_drafts)]
        t = self._longs
        return Batch(t(ids), t(pos), t(write), segments, t(logit_rows))

    def _longs(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def _packed_forward(self, items: list[ForwardItem]) -> torch.Tensor:
        """The generic path: the transformers forward over one packed sequence under a 4-D mask."""
        max_len = self.cache.max_len
        tok_ids: list[int] = []
        tok_pos: list[int] = []
        tok_seq: list[int] = []
        tok_index: list[int] = []
        key_index: list[int] = []
        key_pos: list[int] = []
        key_seq: list[int] = []
        logit_rows: list[int] = []
        for i, it in enumerate(items):
            n, end, base = len(it.tokens), it.start + len(it.tokens), it.slot * max_len
            offset = len(tok_ids)
            tok_ids += it.tokens
            tok_pos += range(it.start, end)
            tok_seq += [i] * n
            tok_index += range(base + it.start, base + end)
            key_index += range(base, base + end)
            key_pos += range(end)
            key_seq += [i] * end
            logit_rows += range(offset + n - it.num_logits, offset + n)

        t = self._longs
        tok_pos_t, key_pos_t = t(tok_pos), t(key_pos)
        # A token sees the keys of its own request at positions <= its own.
        mask = key_pos_t[None, :] <= tok_pos_t[:, None]
        if len(items) > 1:
            mask &= t(tok_seq)[:, None] == t(key_seq)[None, :]
        key_range = (key_index[0], key_index[0] + len(key_index)) if len(items) == 1 else None
        self.cache.layout = PackedLayout(t(tok_index), t(key_index), key_range)
        try:
            out = self.body(
                input_ids=t(tok_ids)[None],
                position_ids=tok_pos_t[None],
                attention_mask=mask[None, None],
                past_key_values=self.cache,
                use_cache=True,
            )
        finally:
            self.cache.layout = None
        hidden = out.last_hidden_state[0, t(logit_rows)]
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[:, : self.vocab_size]
