"""Runs one model over a ragged batch: many requests, each with its own cached prefix and its own
number of new tokens, packed into a single sequence so no compute is spent on padding.

Two execution paths, chosen per model at start-up (``ModelRunner.path``):

- ``native`` (Llama, Qwen2, Mistral, SmolLM2, Qwen3, Gemma 3, Phi-3: ``decoder_families``):
  specdec's own forward (``native_decoder``). Batch invariant: a request's logits are
  bit-identical whatever else is in the forward, and verifying drafts gives the logits plain
  decoding would give.
- ``transformers`` (every other ``AutoModelForCausalLM`` whose attention writes through
  ``past_key_values.update`` and accepts a 4-D mask): the model's own forward over one packed
  sequence under a block-causal mask. Its linear layers are prepared like the native ones, but a
  query's attention reduces over the whole packed batch, so rows may differ in the last bits with
  the batch: speculation stays lossless in distribution, greedy output can differ at near-ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_core.execution.attention import Segment, packed_attention, split_single_rows
from specdec_core.execution.decode_graphs import Bucket, DecodeGraphs, kv_bucket
from specdec_core.execution.decoder_families import check_transformers_path, describe
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.gguf_weights import attach_block_weights, detach_block_weights, prepare_block_linears
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.host_upload import HostUpload, Ref
from specdec_core.execution.kv_cache import PackedLayout, PagedKVCache, contiguous_base, token_rows
from specdec_core.execution.linear_kernels import prepare_linears
from specdec_core.execution.native_decoder import Batch, NativeDecoder


@dataclass
class ForwardPlan:
    """The host half of one forward: every index it needs, placed in a step's ``HostUpload``
    (so a step with several forwards uploads once); ``ModelRunner.run`` does the rest."""

    refs: dict[str, Ref]
    num_logits: int
    # native, segmented: row, q_len, base, kv_len, group (index into ``gathers`` or -1: a slice)
    segments: list[tuple[int, int, int, int, int]] | None = None
    gathers: list[Ref] | None = None  # native, segmented: cache rows of requests not in one run
    packed_shape: Bucket | None = None  # native, packed: groups, rows and keys per group
    bucketed: bool = False  # native, packed: runs in its bucket's static shape (``decode_graphs``)
    key_range: tuple[int, int] | None = None  # transformers path, one request: its contiguous keys


@dataclass
class ForwardItem:
    """One request's part of a batched forward.

    ``blocks`` is its block table (``kv_cache``), covering every position fed; ``start`` is how
    many of its tokens are already cached; ``tokens`` are fed at positions
    ``start..start+len(tokens)-1``; logits are returned for the last ``num_logits`` of them. The
    last ``num_drafts`` tokens are speculative: each is attended on its own, exactly as if it were
    decoded alone (see ``native_decoder``). ``draft_paths``: the drafts form a token tree,
    ``draft_paths[j]`` being the drafts from the root's child down to draft j:
    draft j sits at position ``start + known + len(draft_paths[j]) - 1`` and attends to the known
    tokens and its path only, its keys written at cache position ``start + known + j`` (None: a
    chain, draft j's path being drafts 0..j; ``supports_trees`` says where trees run). ``extra_logits``: logits also come back for that many
    rows before the last ``num_logits`` (a prompt's rows, for its log-probabilities); they follow
    every item's last ``num_logits`` rows, so the rows verification reads keep their places.
    """

    blocks: list[int]
    start: int
    tokens: list[int]
    num_logits: int
    num_drafts: int = 0
    extra_logits: int = 0
    draft_paths: list[list[int]] | None = None

    def positions(self) -> list[int]:
        """Each fed token's position (a tree's drafts share positions by depth)."""
        end = self.start + len(self.tokens)
        if self.draft_paths is None:
            return list(range(self.start, end))
        known_end = end - self.num_drafts
        return list(range(self.start, known_end)) + [known_end + len(a) - 1 for a in self.draft_paths]


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
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.native: NativeDecoder | None = None
        self.attention = profile.attention
        self.row_attention = profile.row_attention(head_dim)
        # gguf: the linears of a model converted from a GGUF file get the file's blocks while preparing
        self.block_layers = attach_block_weights(model) if profile.kernels == "gguf" else 0
        try:
            self._prepare(model, max_len, release_weights, head_rows)
        finally:
            detach_block_weights(model)
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
        quantize = self.profile.kernels
        spec, why_not = describe(model, max_len)
        if spec is not None:
            self.native = NativeDecoder(model, spec, self.profile, max_len, release=release_weights, head_rows=head_rows)
            self.path = "native"
        else:
            check_transformers_path(model, why_not, head_rows)
            if quantize == "gguf":
                prepare_block_linears(model)
            prepare_linears(model, quantize)
            self.body = model.base_model
            self.lm_head = model.get_output_embeddings()
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
        if self.native is not None:
            return self._plan_native(items, upload)
        return self._plan_packed(items, upload)

    @torch.inference_mode()
    def run(self, plan: ForwardPlan, upload: HostUpload, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of a planned forward. ``input_ids`` replaces the planned token ids: tokens
        drawn on the device this step (drafts) are fed without a trip to the host."""
        ids = upload[plan.refs["ids"]] if input_ids is None else input_ids
        if self.native is None:
            return self._run_packed(plan, upload, ids)
        if plan.bucketed and plan.packed_shape is not None and self.graphs is not None:
            hidden = self.graphs.run(plan.packed_shape, ids, upload[plan.refs["index"]])
            logits = self.native.head(hidden.index_select(0, upload[plan.refs["logit_rows"]]))
        else:
            logits = self.native(self._native_batch(plan, upload, ids), self.cache)
        rows = self.native.head_rows
        if rows is None:
            return logits[:, : self.vocab_size]
        return logits.new_full((logits.shape[0], self.vocab_size), float("-inf")).index_copy_(1, rows, logits)

    def _token_refs(self, items: list[ForwardItem], upload: HostUpload) -> tuple[dict[str, Ref], int]:
        """What every forward needs, whichever path: token ids, positions, the flat cache rows
        they are written to, and the rows whose logits come back (and how many)."""
        lists = self._token_lists(items)
        return {name: upload.ints(values) for name, values in lists.items()}, len(lists["logit_rows"])

    def _token_lists(self, items: list[ForwardItem]) -> dict[str, list[int]]:
        bs = self.cache.block_size
        ids: list[int] = []
        pos: list[int] = []
        write: list[int] = []
        logit_rows: list[int] = []
        extra_rows: list[int] = []
        for it in items:
            n, row = len(it.tokens), len(ids)
            ids += it.tokens
            pos += it.positions()
            write += token_rows(it.blocks, bs, it.start, it.start + n)
            logit_rows += range(row + n - it.num_logits, row + n)
            extra_rows += range(row + n - it.num_logits - it.extra_logits, row + n - it.num_logits)
        return {"ids": ids, "pos": pos, "write": write, "logit_rows": logit_rows + extra_rows}

    def _plan_native(self, items: list[ForwardItem], upload: HostUpload) -> ForwardPlan:
        """The tokens' indices, then the attention's layout."""
        if self.attention != "packed":
            plan = ForwardPlan(*self._token_refs(items, upload))
            plan.segments, plan.gathers = self._segments(items, upload)
            return plan
        return self._plan_packed_attention(items, upload)

    def _segments(self, items: list[ForwardItem], upload: HostUpload) -> tuple[list[tuple[int, int, int, int, int]], list[Ref]]:
        """Where the row kernel runs (``rows_alone``), every row is a segment of its own over
        its keys up to it. Elsewhere a request's known tokens are cut into attention segments at
        absolute block boundaries (a block's rows over the keys up to the block's end), and every
        draft is a segment of its own. Either way a draft is scored by exactly the call that
        would score it if it were decoded alone, and a full block of a prompt gets the same rows
        however the prompt was chunked or how much of it came from the prefix cache (which can so
        reuse any full block); with rows alone, also the rows decoding gives the same tokens
        (measured on the default pair: prefill 0.98-1.01x the time of block segments at
        128-2048 tokens). A request whose blocks are not one run gets its rows gathered (once
        per layer)."""
        segments: list[tuple[int, int, int, int, int]] = []
        gathers: list[Ref] = []
        row, bs = 0, self.cache.block_size
        for it in items:
            end = it.start + len(it.tokens)
            base, group = contiguous_base(it.blocks, bs, end), -1
            if base is None:
                base, group = 0, len(gathers)
                gathers.append(upload.ints(token_rows(it.blocks, bs, 0, end)))
            known_end = end - it.num_drafts
            pos = it.start
            while pos < known_end:
                stop = pos + 1 if self.rows_alone else min(known_end, (pos // bs + 1) * bs)
                segments.append((row + pos - it.start, stop - pos, base, stop, group))
                pos = stop
            row += known_end - it.start
            if it.draft_paths is None:
                segments += [(row + j, 1, base, known_end + j + 1, group) for j in range(it.num_drafts)]
            else:  # a tree node's keys: the known tokens', then its ancestors' and its own
                segments += self._tree_segments(it, row, known_end, gathers, upload)
            row += it.num_drafts
        return segments, gathers

    def _tree_segments(self, it: ForwardItem, row: int, known_end: int, gathers: list[Ref],
                       upload: HostUpload) -> list[tuple[int, int, int, int, int]]:
        """One segment per node of a token tree, over the known tokens' keys and its path's. A
        node's path is a prefix of the path down its first children to a leaf, so one key list per
        leaf serves every node above it, as one list serves a chain."""
        bs = self.cache.block_size
        known = token_rows(it.blocks, bs, 0, known_end)
        slots = token_rows(it.blocks, bs, known_end, known_end + it.num_drafts)
        paths = it.draft_paths or []
        first_child: dict[int, int] = {}
        for j, path in enumerate(paths):
            first_child.setdefault(path[-2] if len(path) > 1 else -1, j)
        leaf_lists: dict[int, int] = {}
        segments = []
        for j, path in enumerate(paths):
            leaf = j
            while leaf in first_child:
                leaf = first_child[leaf]
            if leaf not in leaf_lists:
                leaf_lists[leaf] = len(gathers)
                gathers.append(upload.ints(known + [slots[a] for a in paths[leaf]]))
            segments.append((row + j, 1, 0, known_end + len(path), leaf_lists[leaf]))
        return segments

    def _plan_packed_attention(self, items: list[ForwardItem], upload: HostUpload) -> ForwardPlan:
        """One attention call per layer: every request is a group of up to ``q_max`` rows over
        ``kv_max`` keys gathered from its own (``kv_bucket``: a power of two, so that a padded
        and an eager forward make the same call), under a causal mask (a draft row at position
        p sees keys 0..p, as when decoded alone). Padding rows see key 0 and are never read back.
        Where the forward fits a bucket of ``decode_graphs``, its groups and tokens are padded
        to the bucket's and its indices uploaded in the bucket's static-buffer order."""
        bs = self.cache.block_size
        q_max = max(len(it.tokens) for it in items)
        kv_max = kv_bucket(max(it.start + len(it.tokens) for it in items), bs, self.max_len)
        bucket = self.graphs.bucket(len(items), q_max, kv_max) if self.graphs is not None else None
        shape = bucket or Bucket(len(items), q_max, kv_max)
        q = shape.q  # query slots per request: a bucket may give more than q_max
        lists = self._token_lists(items)
        q_gather: list[int] = []
        q_pos: list[int] = []
        k_gather: list[int] = []
        out_rows: list[int] = []
        spare: list[int] = []  # query slots no real token reads (padding tokens do, when bucketed)
        row = 0
        for g, it in enumerate(items):
            n = len(it.tokens)
            keys = token_rows(it.blocks, bs, 0, it.start + n)
            q_gather += [row + min(i, n - 1) for i in range(q)]
            q_pos += [it.start + i if i < n else 0 for i in range(q)]
            k_gather += keys + [keys[0]] * (kv_max - len(keys))  # padding keys are masked out
            out_rows += range(g * q, g * q + n)
            spare += range(g * q + n, (g + 1) * q)
            row += n
        num_logits = len(lists["logit_rows"])
        refs = {"ids": upload.ints(lists["ids"]), "logit_rows": upload.ints(lists["logit_rows"])}
        plan = ForwardPlan(refs, num_logits, packed_shape=shape, bucketed=bucket is not None)
        if bucket is None:
            refs.update(pos=upload.ints(lists["pos"]), write=upload.ints(lists["write"]), q_gather=upload.ints(q_gather),
                        q_pos=upload.ints(q_pos), k_gather=upload.ints(k_gather), out_rows=upload.ints(out_rows))
            return plan
        # Padding: tokens at position 0 writing to the scratch block; groups over scratch keys.
        scratch, pad, extra = self.cache.scratch_row, bucket.tokens - row, bucket.groups - len(items)
        spare += range(len(items) * q, bucket.tokens)
        refs["index"] = upload.ints(
            lists["pos"] + [0] * pad + lists["write"] + [scratch] * pad + q_gather + [0] * (extra * q)
            + q_pos + [0] * (extra * q) + k_gather + [scratch] * (extra * kv_max) + out_rows + spare)
        return plan

    def _native_batch(self, plan: ForwardPlan, upload: HostUpload, ids: torch.Tensor) -> Batch:
        r = plan.refs
        batch = Batch(ids, upload[r["pos"]], upload[r["write"]], upload[r["logit_rows"]])
        if plan.packed_shape is not None:
            shape = plan.packed_shape
            batch.packed = packed_attention(upload[r["q_gather"]], upload[r["q_pos"]], upload[r["k_gather"]],
                                            upload[r["out_rows"]], shape.groups, shape.q, shape.kv)
        else:
            gathers = [upload[ref] for ref in plan.gathers or []]
            batch.segments = [Segment(row, q_len, base, kv_len, self._causal(q_len, kv_len),
                                      gathers[group] if group >= 0 else None, group)
                              for row, q_len, base, kv_len, group in plan.segments or []]
            if self.row_attention:
                batch.segments, batch.rows = split_single_rows(batch.segments)
        return batch

    def _causal(self, q_len: int, kv_len: int) -> torch.Tensor | None:
        if q_len == 1:
            return None
        q_pos = torch.arange(kv_len - q_len, kv_len, device=self.device)
        return torch.arange(kv_len, device=self.device)[None, :] <= q_pos[:, None]

    def _plan_packed(self, items: list[ForwardItem], upload: HostUpload) -> ForwardPlan:
        """The generic path: one packed sequence under a block-causal mask (its indices)."""
        bs = self.cache.block_size
        refs, num_logits = self._token_refs(items, upload)
        keys: dict[str, list[int]] = {"tok_seq": [], "key_index": [], "key_pos": [], "key_seq": []}
        for i, it in enumerate(items):
            end = it.start + len(it.tokens)
            keys["tok_seq"] += [i] * len(it.tokens)
            keys["key_index"] += token_rows(it.blocks, bs, 0, end)
            keys["key_pos"] += range(end)
            keys["key_seq"] += [i] * end
        index = keys["key_index"]
        base = contiguous_base(items[0].blocks, bs, len(index)) if len(items) == 1 else None
        key_range = (base, base + len(index)) if base is not None else None
        if len(items) == 1:  # one request: every key is its own, no sequence mask
            del keys["tok_seq"], keys["key_seq"]
        refs.update({name: upload.ints(values) for name, values in keys.items()})
        return ForwardPlan(refs, num_logits, key_range=key_range)

    def _run_packed(self, plan: ForwardPlan, upload: HostUpload, ids: torch.Tensor) -> torch.Tensor:
        """The transformers forward over one packed sequence under a 4-D mask."""
        r = plan.refs
        tok_pos, key_pos = upload[r["pos"]], upload[r["key_pos"]]
        # A token sees the keys of its own request at positions <= its own.
        mask = key_pos[None, :] <= tok_pos[:, None]
        if "tok_seq" in r:
            mask &= upload[r["tok_seq"]][:, None] == upload[r["key_seq"]][None, :]
        self.cache.layout = PackedLayout(upload[r["write"]], upload[r["key_index"]], plan.key_range)
        try:
            out = self.body(
                input_ids=ids[None],
                position_ids=tok_pos[None],
                attention_mask=mask[None, None],
                past_key_values=self.cache,
                use_cache=True,
            )
        finally:
            self.cache.layout = None
        hidden = out.last_hidden_state[0].index_select(0, upload[r["logit_rows"]])
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[:, : self.vocab_size]
