"""specdec's own forward pass for the Llama family (Llama, Qwen2, Mistral, SmolLM2).

Why own it: the transformers forward packs a ragged batch into one sequence under a 4-D mask, so
every query reduces over the keys of every request (the reduction, and so the rounding, depends on
the batch, and the work grows with its square), and it runs unfused projections with per-layer
Python overhead. Here:

- projections are fused (QKV, gate+up) and prepared once for the device and mode
  (``linear_kernels``), so a row's result does not depend on the other rows of the call;
- RoPE comes from a table indexed by position, norms and activations are row-wise (one C call
  each on a CPU in float32, ``row_kernels``, else torch ops);
- attention reads each request's own keys only (``attention``): one call per segment on the CPU,
  where that keeps every row bit-identical alone and batched and a verified draft equal to the
  same token decoded alone; one call per layer for the whole forward on CUDA.

K/V are written in place into the request's blocks of ``PagedKVCache``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec_core.execution import row_kernels
from specdec_core.execution.attention import PackedAttention, RowAttention, Segment, attend_packed, attend_segments
from specdec_core.execution.gguf_weights import block_linear
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.kv_cache import PagedKVCache
from specdec_core.execution.linear_kernels import PreparedLinear, Quantize, prepare_linear

NATIVE_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


def supports_native(model: HFModule, max_len: int) -> bool:
    """True when ``model`` is a Llama-family model this module computes exactly like transformers."""
    cfg = model.config
    if type(model).__name__ not in NATIVE_ARCHITECTURES:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    window = getattr(cfg, "sliding_window", None)
    if window is not None and getattr(cfg, "use_sliding_window", True) and window < max_len:
        return False
    return True


@dataclass
class Batch:
    """A packed ragged batch, built once per forward by the runner; attention takes one of the
    two layouts of ``attention``."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    write_index: torch.Tensor  # [T] flat cache rows (through each request's block table)
    logit_rows: torch.Tensor | None  # rows whose logits are returned (None: a bucketed forward's body)
    segments: list[Segment] | None = None
    rows: RowAttention | None = None  # one-row segments, attended by the C kernel
    packed: PackedAttention | None = None


class RMSNorm(torch.nn.Module):
    """Row-wise RMS norm computed in fp32, as transformers' Llama/Qwen2 do."""

    def __init__(self, weight: torch.Tensor, eps: float, fused: bool) -> None:
        super().__init__()
        self.weight = weight.detach().contiguous()
        self.eps = eps
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return row_kernels.rms_norm(x, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@dataclass(frozen=True)
class HeadShape:
    heads: int
    kv_heads: int
    head_dim: int


class DecoderLayer(torch.nn.Module):
    """Pre-norm attention + SwiGLU MLP, with the transformers layer's weights prepared once."""

    def __init__(self, layer: HFModule, shape: HeadShape, quantize: Quantize, release: bool, fused: bool) -> None:
        """``fused``: the row-wise operations run as ``row_kernels`` (float32 on the CPU)."""
        super().__init__()
        self.shape = shape
        self.fused = fused
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm = RMSNorm(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, fused)
        self.post_norm = RMSNorm(layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                                 fused)
        self.qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj], quantize)
        self.o = _fused([attn.o_proj], quantize)
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj], quantize)
        self.down = _fused([mlp.down_proj], quantize)
        if release:  # the prepared copies are all that is used from now on
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                _release(lin)

    def forward(self, x: torch.Tensor, batch: Batch, cos: torch.Tensor, sin: torch.Tensor,
                keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``keys``/``values``: this layer's cache ``[kv_heads, blocks * block_size, head_dim]``."""
        heads, kv_heads, head_dim = self.shape.heads, self.shape.kv_heads, self.shape.head_dim
        tokens = x.shape[0]
        qkv = self.qkv(self.input_norm(x))
        if self.fused:  # queries and keys rotated in place, in one call
            row_kernels.rope_(qkv, heads + kv_heads, head_dim, cos, sin)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q, k, v = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
        if not self.fused:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, T, D]
        keys.index_copy_(1, batch.write_index, k.to(keys.dtype))
        values.index_copy_(1, batch.write_index, v.to(values.dtype))
        if batch.packed is not None:
            out = attend_packed(q, keys, values, batch.packed)
        else:
            out = attend_segments(q, keys, values, batch.segments or [], batch.rows)
        x = x + self.o(out.reshape(tokens, heads * head_dim))
        gate_up = self.gate_up(self.post_norm(x))
        if self.fused:
            return x + self.down(row_kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class NativeLlama(torch.nn.Module):
    """The decoder stack and head of a Llama-family model, prepared for specdec's ragged batches."""

    def __init__(self, model: HFModule, quantize: Quantize, max_len: int, release: bool = False,
                 head_rows: list[int] | None = None) -> None:
        """``head_rows``: score only these token ids (a draft's frequent-vocabulary head); the
        logits then come back in that order, one column per listed id."""
        super().__init__()
        cfg = model.config
        base = model.base_model
        heads = cfg.num_attention_heads
        shape = HeadShape(heads, getattr(cfg, "num_key_value_heads", None) or heads,
                          getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        self.embed = base.embed_tokens.weight.detach()
        fused = row_kernels.supported(self.embed.device, self.embed.dtype)
        self.layers = torch.nn.ModuleList(DecoderLayer(layer, shape, quantize, release, fused) for layer in base.layers)
        self.norm = RMSNorm(base.norm.weight, base.norm.variance_epsilon, fused)
        head = model.get_output_embeddings()
        weight, bias = head.weight.detach(), getattr(head, "bias", None)
        self.head_rows = torch.tensor(head_rows, dtype=torch.long, device=weight.device) if head_rows else None
        if self.head_rows is not None:
            weight = weight[self.head_rows]
            bias = bias.detach()[self.head_rows] if bias is not None else None
        blocks = block_linear([head], self.head_rows) if quantize == "gguf" else None
        self.lm_head: PreparedLinear = blocks or prepare_linear(weight, bias, quantize)
        if release and head.weight is not base.embed_tokens.weight:
            _release(head)
        self.cos, self.sin = _rope_table(base.rotary_emb, max_len, self.embed)

    @torch.inference_mode()
    def forward(self, batch: Batch, cache: PagedKVCache) -> torch.Tensor:
        """Hidden states of ``batch.logit_rows`` after the final norm, projected to logits."""
        if batch.logit_rows is None:
            raise ValueError("a forward needs the rows whose logits it returns")
        return self.head(self.hidden(batch, cache).index_select(0, batch.logit_rows))

    def hidden(self, batch: Batch, cache: PagedKVCache) -> torch.Tensor:
        """Every row's last hidden state (before the final norm); writes the batch's keys. The
        part a CUDA graph captures (``decode_graphs``): fixed shapes in, no host reads."""
        x = F.embedding(batch.input_ids, self.embed)
        cos, sin = self.cos[batch.positions], self.sin[batch.positions]
        for i, layer in enumerate(self.layers):
            x = layer(x, batch, cos, sin, cache.keys[i], cache.values[i])
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden rows (row-wise: a row's logits do not depend on the others)."""
        return self.lm_head(self.norm(x)).float()


def _fused(linears: list[HFModule], quantize: Quantize) -> PreparedLinear:
    """One prepared linear whose output is the concatenation of ``linears``' outputs."""
    if quantize == "gguf" and (blocks := block_linear(linears)) is not None:
        return blocks
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    biases = [getattr(lin, "bias", None) for lin in linears]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b.detach() if b is not None else weight.new_zeros(lin.weight.shape[0])
                          for b, lin in zip(biases, linears)])
    return prepare_linear(weight, bias, quantize)


def _release(linear: HFModule) -> None:
    """Drop an original weight the prepared layer has copied (halves peak memory for big models)."""
    linear.weight = torch.nn.Parameter(linear.weight.new_empty(0), requires_grad=False)
    if getattr(linear, "bias", None) is not None:
        linear.bias = torch.nn.Parameter(linear.bias.new_empty(0), requires_grad=False)


def _rope_table(rotary: HFModule, max_len: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for every position, computed once by the model's own rotary module (so every RoPE
    variant transformers knows is honoured) and then only indexed: a row's rotation never depends
    on how many rows share the call."""
    positions = torch.arange(max_len, device=like.device)[None]
    cos, sin = rotary(like[:1].float(), positions)
    return cos[0].to(like.dtype), sin[0].to(like.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, D]`` by the per-row ``cos``/``sin`` ``[T, D]`` (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
