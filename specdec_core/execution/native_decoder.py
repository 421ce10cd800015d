"""specdec's own forward pass for the decoder families of ``decoder_families`` (Llama, Qwen2,
Mistral, SmolLM2, Qwen3, Gemma 3, Phi-3).

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
  same token decoded alone; one call per layer for the whole forward on CUDA. A sliding-window
  layer reads the same layouts cut to its window (``Batch.for_window``).

K/V are written in place into the request's blocks of ``PagedKVCache``. In the CPU default
(float32, GGUF block linears, one-row segments) the layers below run as one C call per forward
(``row_layers``), computing the same bits as ``DecoderLayer`` does op by op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specdec_core.execution import row_kernels
from specdec_core.execution.attention import PackedAttention, RowAttention, Segment, attend_packed, attend_segments
from specdec_core.execution.decoder_families import DecoderSpec, LayerSpec, rope_tables
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.gguf_linear import BlockWeight
from specdec_core.execution.gguf_weights import ATTRIBUTE, block_linear
from specdec_core.execution.hf_types import HFModule
from specdec_core.execution.kv_cache import PagedKVCache
from specdec_core.execution.linear_kernels import Quantize, prepare_linear
from specdec_core.execution.prepared_linear import PreparedLinear
from specdec_core.execution.row_layers import RowLayers


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
    _windowed: dict[int, Batch] = field(default_factory=dict, repr=False)

    def for_window(self, window: int | None) -> Batch:
        """The attention layout of a layer whose rows see only their last ``window`` keys (None:
        this one), derived once per forward and shared by every layer with that window."""
        if window is None:
            return self
        if window not in self._windowed:
            self._windowed[window] = Batch(
                self.input_ids, self.positions, self.write_index, self.logit_rows,
                None if self.segments is None else [s.windowed(window) for s in self.segments],
                None if self.rows is None else self.rows.windowed(window),
                None if self.packed is None else self.packed.windowed(window))
        return self._windowed[window]


class RMSNorm(torch.nn.Module):
    """Row-wise RMS norm computed in fp32, as transformers' Llama/Qwen2 do (Gemma's ``1 + w``
    arrives folded into the weight, ``decoder_families.Norm``)."""

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


class DecoderLayer(torch.nn.Module):
    """Pre-norm attention + gated MLP, with the transformers layer's weights prepared once."""

    def __init__(self, layer: LayerSpec, spec: DecoderSpec, quantize: Quantize, release: bool, fused: bool,
                 qkv_rows: torch.Tensor | None) -> None:
        """``fused``: the row-wise operations run as ``row_kernels`` (float32 on the CPU);
        ``qkv_rows``: the fused QKV output in this order (partial rotary, ``_rotary_layout``)."""
        super().__init__()
        self.spec = spec
        self.fused = fused
        self.window = layer.window
        self.rope = layer.rope
        self.norms = torch.nn.ModuleDict({name: RMSNorm(n.weight, n.eps, fused) for name, n in layer.norms.items()})
        self.qkv = _fused(layer.qkv, quantize, qkv_rows)
        self.o = _fused([layer.o], quantize)
        self.gate_up = _fused(layer.gate_up, quantize)
        self.down = _fused([layer.down], quantize)
        if release:  # the prepared copies are all that is used from now on
            for lin in [*layer.qkv, layer.o, *layer.gate_up, layer.down]:
                _release(lin)

    def forward(self, x: torch.Tensor, batch: Batch, cos: torch.Tensor, sin: torch.Tensor,
                keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``keys``/``values``: this layer's cache ``[kv_heads, blocks * block_size, head_dim]``."""
        heads, kv_heads, head_dim = self.spec.heads, self.spec.kv_heads, self.spec.head_dim
        tokens = x.shape[0]
        qkv = self.qkv(self.norms["input"](x))
        if "q" in self.norms:
            qkv = self._norm_heads(qkv)
        if self.fused:  # queries and keys rotated in place, in one call
            row_kernels.rope_(qkv, heads + kv_heads, head_dim, cos, sin)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q, k, v = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
        if not self.fused:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, T, D]
        keys.index_copy_(1, batch.write_index, k.to(keys.dtype))
        values.index_copy_(1, batch.write_index, v.to(values.dtype))
        seen = batch.for_window(self.window)
        if seen.packed is not None:
            out = attend_packed(q, keys, values, seen.packed, self.spec.attn_scale)
        else:
            out = attend_segments(q, keys, values, seen.segments or [], seen.rows, self.spec.attn_scale)
        h = self.o(out.reshape(tokens, heads * head_dim))
        if self.spec.sandwich:
            h = self.norms["post_attention"](h)
        x = x + h
        gate_up = self.gate_up(self.norms["mlp"](x))
        if self.fused:
            h = self.down(row_kernels.gate_mul(gate_up, self.spec.activation))
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) if self.spec.activation == "silu" else F.gelu(gate, approximate="tanh")
            h = self.down(act * up)
        if self.spec.sandwich:
            h = self.norms["post_mlp"](h)
        return x + h

    def _norm_heads(self, qkv: torch.Tensor) -> torch.Tensor:
        """Qwen3 / Gemma 3: each query and key head RMS-normed on its own (row-wise, like any norm)."""
        tokens, (heads, kv_heads, head_dim) = qkv.shape[0], (self.spec.heads, self.spec.kv_heads, self.spec.head_dim)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = self.norms["q"](q.reshape(tokens * heads, head_dim)).view(tokens, -1)
        k = self.norms["k"](k.reshape(tokens * kv_heads, head_dim)).view(tokens, -1)
        return torch.cat([q, k, v], dim=-1)


class NativeDecoder(torch.nn.Module):
    """The decoder stack and head of a model ``decoder_families.describe`` accepted, prepared for
    specdec's ragged batches."""

    def __init__(self, model: HFModule, spec: DecoderSpec, profile: DeviceProfile, max_len: int, release: bool = False,
                 head_rows: list[int] | None = None) -> None:
        """``profile``: the linear kernels and whether the C row kernels run (``device_profile``).
        ``head_rows``: score only these token ids (a draft's frequent-vocabulary head); the
        logits then come back in that order, one column per listed id."""
        super().__init__()
        base = model.base_model
        self.spec = spec
        self.embed = base.embed_tokens.weight.detach()
        # a model served from its GGUF file looks its tokens up in the embedding's blocks
        self.embed_blocks: BlockWeight | None = getattr(base.embed_tokens, ATTRIBUTE, None) if self.embed.numel() == 0 else None
        like = spec.final_norm.weight  # a real tensor of the model's device and dtype
        quantize, fused = profile.kernels, profile.row_kernels
        self.rope, qkv_rows = _rotary_layout(rope_tables(model, max_len, like), spec)
        if qkv_rows is not None and any("q" in layer.norms for layer in spec.layers):
            raise ValueError("partial rotary dims with per-head query/key norms are not supported")
        self.layers = torch.nn.ModuleList(DecoderLayer(layer, spec, quantize, release, fused, qkv_rows)
                                          for layer in spec.layers)
        self.norm = RMSNorm(spec.final_norm.weight, spec.final_norm.eps, fused)
        # the whole stack in one C call for forwards of one-row segments (the CPU default's every forward)
        self.row_layers = RowLayers.of(list(self.layers), spec, fused)
        self.embed_scale = None if spec.embed_scale is None else torch.tensor(spec.embed_scale).to(like.dtype)
        head = model.get_output_embeddings()
        self.head_rows = torch.tensor(head_rows, dtype=torch.long, device=like.device) if head_rows else None
        blocks = block_linear([head], self.head_rows) if quantize == "gguf" else None
        if blocks is None:
            weight, bias = _dense_weight(head), getattr(head, "bias", None)
            if self.head_rows is not None:
                weight = weight[self.head_rows]
                bias = bias.detach()[self.head_rows] if bias is not None else None
        self.lm_head: PreparedLinear = blocks or prepare_linear(weight, bias, quantize)
        if release and head.weight is not base.embed_tokens.weight:
            _release(head)

    @torch.inference_mode()
    def forward(self, batch: Batch, cache: PagedKVCache) -> torch.Tensor:
        """Hidden states of ``batch.logit_rows`` after the final norm, projected to logits."""
        if batch.logit_rows is None:
            raise ValueError("a forward needs the rows whose logits it returns")
        return self.head(self.hidden(batch, cache).index_select(0, batch.logit_rows))

    def hidden(self, batch: Batch, cache: PagedKVCache) -> torch.Tensor:
        """Every row's last hidden state (before the final norm); writes the batch's keys. The
        part a CUDA graph captures (``decode_graphs``): fixed shapes in, no host reads."""
        if self.embed_blocks is not None:
            x = self.embed_blocks.dequantize_rows(batch.input_ids)
        else:
            x = F.embedding(batch.input_ids, self.embed)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        rope = {name: (cos[batch.positions], sin[batch.positions]) for name, (cos, sin) in self.rope.items()}
        if self.row_layers is not None and batch.rows is not None and not batch.segments and batch.packed is None:
            rows = {window: batch.for_window(window).rows for window in self.row_layers.windows}
            return self.row_layers.run(x, batch.write_index, rows, rope, cache)  # type: ignore[arg-type]
        for i, (layer, spec) in enumerate(zip(self.layers, self.spec.layers)):
            x = layer(x, batch, *rope[spec.rope], cache.keys[i], cache.values[i])
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden rows (row-wise: a row's logits do not depend on the others)."""
        logits = self.lm_head(self.norm(x)).float()
        if self.spec.softcap:
            logits = torch.tanh(logits / self.spec.softcap) * self.spec.softcap
        return logits


def _rotary_layout(tables: dict[str, tuple[torch.Tensor, torch.Tensor]], spec: DecoderSpec
                   ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]:
    """The rotary tables at full head width, and the order of the fused QKV output rows that
    makes them exact (None: as stored).

    Partial rotary (Phi-4-mini rotates 96 of 128 dims, pairing dim i with i + 48) is computed by
    the full-width rotate-half kernel after reordering each query and key head's dims (the
    same order for both, so their dot products are unchanged): rotated pairs land at i and
    i + head_dim / 2, the dims that are not rotated fill the rest with cos 1 and sin 0."""
    rot = next(iter(tables.values()))[0].shape[-1]
    dim = spec.head_dim
    if rot == dim:
        return tables, None
    half, keep = rot // 2, (dim - rot) // 2
    order = [*range(half), *range(rot, rot + keep), *range(half, rot), *range(rot + keep, dim)]
    order_t = torch.tensor(order)
    heads = spec.heads + spec.kv_heads
    rows = torch.cat([(h * dim + order_t) for h in range(heads)]
                     + [torch.arange(heads * dim, (heads + spec.kv_heads) * dim)])
    widened = {}
    for name, (cos, sin) in tables.items():
        one, zero = cos.new_ones(cos.shape[0], keep), cos.new_zeros(cos.shape[0], keep)
        widened[name] = (torch.cat([cos[:, :half], one, cos[:, :half], one], dim=1).contiguous(),
                         torch.cat([sin[:, :half], zero, sin[:, :half], zero], dim=1).contiguous())
    return widened, rows


def _fused(linears: list[HFModule], quantize: Quantize, rows: torch.Tensor | None = None) -> PreparedLinear:
    """One prepared linear whose output is the concatenation of ``linears``' outputs (only
    ``rows`` of it, in that order, if given)."""
    if quantize == "gguf" and (blocks := block_linear(linears, rows)) is not None:
        return blocks
    weight = torch.cat([_dense_weight(lin) for lin in linears], dim=0)
    biases = [getattr(lin, "bias", None) for lin in linears]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b.detach() if b is not None else weight.new_zeros(lin.weight.shape[0])
                          for b, lin in zip(biases, linears)])
    if rows is not None:
        weight = weight[rows.to(weight.device)]
        bias = None if bias is None else bias[rows.to(bias.device)]
    return prepare_linear(weight, bias, quantize)


def _dense_weight(linear: HFModule) -> torch.Tensor:
    """A linear's weight; for one served from its GGUF file (an empty placeholder beside its
    blocks), the blocks dequantized: a fused layer whose parts are not all in block formats the
    kernels run is prepared from its dense weight."""
    weight = linear.weight.detach()
    blocks: BlockWeight | None = getattr(linear, ATTRIBUTE, None)
    if weight.numel() == 0 and blocks is not None:
        return blocks.dequantize()
    return weight


def _release(linear: HFModule) -> None:
    """Drop an original weight the prepared layer has copied (halves peak memory for big models),
    and its GGUF blocks, repacked by now (the embedding keeps its own for the lookups)."""
    linear.weight = torch.nn.Parameter(linear.weight.new_empty(0), requires_grad=False)
    if hasattr(linear, ATTRIBUTE):
        delattr(linear, ATTRIBUTE)
    if getattr(linear, "bias", None) is not None:
        linear.bias = torch.nn.Parameter(linear.bias.new_empty(0), requires_grad=False)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, D]`` by the per-row ``cos``/``sin`` ``[T, D]`` (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
