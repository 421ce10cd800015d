"""Runs one model over a ragged batch: many requests, each with its own cached prefix and its own
number of new tokens, packed into a single sequence so no compute is spent on padding.

Two execution paths, chosen per model at start-up (``ModelRunner.path``):

- ``native`` (Llama, Qwen2, Mistral, SmolLM2, Qwen3, Gemma 3, Phi-3: ``decoder_families``):
  specdec's own forward (``native_decoder``). Batch invariant: a request's logits are
  bit-identical whatever else is in the forward, and verifying drafts gives the logits plain
  decoding would give.
- ``transformers`` (every other ``AutoModelForCausalLM`` whose attention writes through
  ``past_key_values.update`` and accepts a 4-D mask): the model's own forward over one packed
  sequence under a block-causal mask (``transformers_forward``); rows may differ in the last bits
  with the batch.

The native path's attention layout (segments or packed groups) and everything else per device
come from the ``DeviceProfile``; the layouts' index plans are ``attention_plans``.
"""

from __future__ import annotations

import torch

from specdec_core.execution.attention_plans import native_batch, plan_packed, plan_segments
from specdec_core.execution.decode_graphs import DecodeGraphs
from specdec_core.execution.decoder_families import describe
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.forward_plan import ForwardItem, ForwardPlan
from specdec_core.execution.gguf_weights import attach_block_weights, detach_block_weights, drop_file_blocks
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.host_heap import return_freed_memory
from specdec_core.execution.host_upload import HostUpload
from specdec_core.execution.kv_cache import PagedKVCache
from specdec_core.execution.native_decoder import NativeDecoder
from specdec_core.execution.transformers_forward import TransformersForward


class ModelRunner:
    """Owns a model and its KV cache; turns ragged batches into one packed forward."""

    def __init__(self, model: HFModule, num_blocks: int, block_size: int, max_len: int, vocab_size: int,
                 profile: DeviceProfile, release_weights: bool = False, head_rows: list[int] | None = None,
                 graph_buckets: tuple[int, int] | None = None) -> None:
        """``num_blocks`` x ``block_size``: the KV pool (``kv_cache``); ``max_len``: the longest
        request (positions the rotary table covers); ``profile``: the kernels, attention layout
        and graphs of this device (``device_profile``).
        ``release_weights``: the runner owns ``model`` and may free the original weights it
        has copied into prepared kernels (halves peak memory); leave it off for shared models.
        ``graph_buckets``: (most requests, most tokens per request) of the forwards to run in
        bucketed static shapes where the profile has decode graphs (``decode_graphs``), captured
        as CUDA graphs on a GPU (``capture_graphs``, or on first use).
        ``head_rows``: score only these token ids (``draft_vocab``); every other logit is -inf,
        so whatever is sampled from the logits has probability 0 outside them."""
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.profile = profile
        self.device = profile.device
        # int8 keeps fp32 activations; the cache follows the activation dtype.
        self.dtype = profile.dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.cache = PagedKVCache(
            cfg.num_hidden_layers, num_blocks, block_size, kv_heads, head_dim, self.dtype, self.device
        )
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.native: NativeDecoder | None = None
        self.generic: TransformersForward | None = None
        self.attention = profile.attention
        self.row_attention = profile.row_attention(head_dim)
        # gguf: the linears of a model converted from a GGUF file get the file's blocks while preparing
        self.block_layers = attach_block_weights(model) if profile.kernels == "gguf" else 0
        try:
            self._prepare(model, max_len, release_weights, head_rows)
        finally:
            detach_block_weights(model)
        if release_weights:
            return_freed_memory()  # the originals' pages, freed while preparing
        self.graphs: DecodeGraphs | None = None
        if graph_buckets is not None and profile.decode_graphs and self.native is not None:
            self.graphs = DecodeGraphs(self.native, self.cache, *graph_buckets, capture=profile.capture_graphs)

    def capture_graphs(self, capture_len: int) -> int:
        """Capture the decode graphs over at most ``capture_len`` keys now (CUDA; see
        ``DecodeGraphs.capture_all``). Called once every model's KV cache is allocated, so
        that the graphs' memory pool cannot take what a cache was sized to get."""
        if self.graphs is None:
            return 0
        bs = self.cache.block_size
        return self.graphs.capture_all(min(capture_len, self.max_len), bs, self.max_len)

    def _prepare(self, model: HFModule, max_len: int, release_weights: bool, head_rows: list[int] | None) -> None:
        spec, why_not = describe(model, max_len)
        if spec is not None:
            if release_weights:
                drop_file_blocks(model)
            self.native = NativeDecoder(model, spec, self.profile, max_len, release=release_weights, head_rows=head_rows)
            self.path = "native"
        else:
            self.generic = TransformersForward(model, self.profile, why_not, head_rows)
            self.path = "transformers"

    @property
    def supports_trees(self) -> bool:
        """Token trees (``ForwardItem.draft_paths``) run on the native segmented path, where
        every draft is its own attention call over exactly its keys (so a tree's nodes keep the
        bits a plain decode of their path gives); the packed and transformers paths mask by
        position, which a tree does not follow."""
        return self.native is not None and self.attention == "segments"

    @property
    def rows_alone(self) -> bool:
        """Every row of a forward, prompt rows included, is attended by its own call over exactly
        its request's keys up to it (``RowAttention``), and every other op is row-invariant: a
        position's keys and values depend only on the tokens up to it, never on whether they
        were prefilled, decoded, drafted or reused, so the prefix cache may share rows the
        decoding wrote (a later turn that re-sends an answer finds it cached)."""
        return self.native is not None and self.row_attention

    def forward(self, items: list[ForwardItem]) -> torch.Tensor:
        """Return float32 logits ``[sum(num_logits), vocab_size]`` in item order (one upload)."""
        upload = HostUpload()
        plan = self.plan(items, upload)
        return self.run(plan, upload.send(self.device))

    def plan(self, items: list[ForwardItem], upload: HostUpload) -> ForwardPlan:
        """Place a forward's indices in ``upload``; ``run`` it once the upload is sent."""
        if not self.supports_trees and any(it.draft_paths is not None for it in items):
            raise ValueError(f"token trees need the native segmented attention path (this runner: {self.path}, "
                             f"{self.attention})")
        bs = self.cache.block_size
        if self.native is None:
            return TransformersForward.plan(items, upload, bs)
        if self.attention == "packed":
            return plan_packed(items, upload, self.cache, self.max_len, self.graphs)
        return plan_segments(items, upload, bs, self.rows_alone)

    @torch.inference_mode()
    def run(self, plan: ForwardPlan, upload: HostUpload, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of a planned forward. ``input_ids`` replaces the planned token ids: tokens
        drawn on the device this step (drafts) are fed without a trip to the host."""
        ids = upload[plan.refs["ids"]] if input_ids is None else input_ids
        if self.generic is not None:
            return self.generic.run(plan, upload, ids, self.cache)[:, : self.vocab_size]
        assert self.native is not None
        if plan.bucketed and plan.packed_shape is not None and self.graphs is not None:
            hidden = self.graphs.run(plan.packed_shape, ids, upload[plan.refs["index"]])
            logits = self.native.head(hidden.index_select(0, upload[plan.refs["logit_rows"]]))
        else:
            logits = self.native(native_batch(plan, upload, ids, self.row_attention), self.cache)
        rows = self.native.head_rows
        if rows is None:
            return logits[:, : self.vocab_size]
        return logits.new_full((logits.shape[0], self.vocab_size), float("-inf")).index_copy_(1, rows, logits)
