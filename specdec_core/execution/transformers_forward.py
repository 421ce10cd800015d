"""The transformers path: a model ``decoder_families.describe`` does not accept runs its own
forward over one packed sequence under a block-causal mask.

Every ``AutoModelForCausalLM`` whose attention writes through ``past_key_values.update`` and
accepts a 4-D mask runs here. Its linear layers are prepared like the native ones, but a query's
attention reduces over the whole packed batch, so rows may differ in the last bits with the
batch: speculation stays lossless in distribution, greedy output can differ at near-ties (the
log says so at start-up: ``check_transformers_path``).
"""

from __future__ import annotations

import torch

from specdec_core.execution.decoder_families import check_transformers_path
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.forward_plan import ForwardItem, ForwardPlan, token_refs
from specdec_core.execution.gguf_weights import prepare_block_linears
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.host_upload import HostUpload
from specdec_core.execution.kv_cache import PackedLayout, PagedKVCache, contiguous_base, token_rows
from specdec_core.execution.linear_kernels import prepare_linears


class TransformersForward:
    """A model's own body and head over specdec's paged cache (``PagedKVCache`` as its
    ``past_key_values``, laid out per forward by ``PackedLayout``)."""

    def __init__(self, model: HFModule, profile: DeviceProfile, why_not: str, head_rows: list[int] | None) -> None:
        """``why_not``: why the native path turned the model down (logged)."""
        check_transformers_path(model, why_not, head_rows)
        if profile.kernels == "gguf":
            prepare_block_linears(model)
        prepare_linears(model, profile.kernels)
        self.body = model.base_model
        self.lm_head = model.get_output_embeddings()
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.softcap = getattr(cfg, "final_logit_softcapping", None)

    @staticmethod
    def plan(items: list[ForwardItem], upload: HostUpload, block_size: int) -> ForwardPlan:
        """One packed sequence's indices: each token's request, and every request's keys."""
        refs, num_logits = token_refs(items, block_size, upload)
        keys: dict[str, list[int]] = {"tok_seq": [], "key_index": [], "key_pos": [], "key_seq": []}
        for i, it in enumerate(items):
            end = it.start + len(it.tokens)
            keys["tok_seq"] += [i] * len(it.tokens)
            keys["key_index"] += token_rows(it.blocks, block_size, 0, end)
            keys["key_pos"] += range(end)
            keys["key_seq"] += [i] * end
        index = keys["key_index"]
        base = contiguous_base(items[0].blocks, block_size, len(index)) if len(items) == 1 else None
        key_range = (base, base + len(index)) if base is not None else None
        if len(items) == 1:  # one request: every key is its own, no sequence mask
            del keys["tok_seq"], keys["key_seq"]
        refs.update({name: upload.ints(values) for name, values in keys.items()})
        return ForwardPlan(refs, num_logits, key_range=key_range)

    def run(self, plan: ForwardPlan, upload: HostUpload, ids: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
        """Float32 logits of the planned rows: the model's forward under a 4-D mask."""
        r = plan.refs
        tok_pos, key_pos = upload[r["pos"]], upload[r["key_pos"]]
        # A token sees the keys of its own request at positions <= its own.
        mask = key_pos[None, :] <= tok_pos[:, None]
        if "tok_seq" in r:
            mask &= upload[r["tok_seq"]][:, None] == upload[r["key_seq"]][None, :]
        cache.layout = PackedLayout(upload[r["write"]], upload[r["key_index"]], plan.key_range)
        try:
            out = self.body(input_ids=ids[None], position_ids=tok_pos[None], attention_mask=mask[None, None],
                            past_key_values=cache, use_cache=True)
        finally:
            cache.layout = None
        hidden = out.last_hidden_state[0].index_select(0, upload[r["logit_rows"]])
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
