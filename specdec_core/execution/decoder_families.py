"""What the native forward needs to know about a transformers decoder, read once at load.

The families specdec runs natively are one shape: pre-norm attention with rotary positions over
grouped KV heads, then a gated MLP. They differ in details, each named here once, so that
``native_decoder`` reads as the algorithm and a new family is a new entry, not a new forward:

- Llama, Qwen2, Mistral (SmolLM2 is a Llama): the base shape;
- Qwen3: an RMS norm over each query and key head before the rotation;
- Gemma 3: query/key norms too, norms after attention and around the MLP ("sandwich"), norm
  weights stored as ``w`` for a scale of ``1 + w``, a tanh-GELU gate, embeddings scaled by
  sqrt(hidden), scores scaled by ``query_pre_attn_scalar``, and sliding-window layers with a
  RoPE base of their own between the global ones;
- Phi-3 / Phi-4-mini: fused qkv and gate_up projections, partial rotary dims, LongRoPE.

``describe`` returns None with the reason for anything else (the runner then takes the
transformers path and logs the reason).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch

from specdec_core.execution.gguf_weights import BLOCKS_ATTRIBUTE
from specdec_core.execution.hf_types import HFModule

logger = logging.getLogger(__name__)

NATIVE_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM",
                        "Gemma3ForCausalLM", "Phi3ForCausalLM")
_GEMMA = ("Gemma3ForCausalLM",)
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class Norm:
    """An RMS norm's effective weight (Gemma's ``1 + w`` already added) and epsilon."""

    weight: torch.Tensor
    eps: float


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: the linears whose outputs concatenate to q|k|v and to gate|up, the
    norms present (``q``/``k``: per head; ``post_attention``/``post_mlp``: sandwich families),
    the sliding window (None: global) and the rotary table the layer reads."""

    qkv: list[HFModule]
    o: HFModule
    gate_up: list[HFModule]
    down: HFModule
    norms: dict[str, Norm]
    window: int | None
    rope: str


@dataclass(frozen=True)
class DecoderSpec:
    family: str
    heads: int
    kv_heads: int
    head_dim: int
    activation: str  # row_kernels.ACTIVATIONS
    sandwich: bool  # norms after attention and around the MLP (Gemma)
    embed_scale: float | None
    attn_scale: float | None  # None: head_dim ** -0.5
    softcap: float | None  # final logit soft-capping
    layers: list[LayerSpec]
    final_norm: Norm


def describe(model: HFModule, max_len: int) -> tuple[DecoderSpec | None, str]:
    """The model's spec, or None and why the native forward does not run it."""
    arch = type(model).__name__
    cfg = model.config
    if arch not in NATIVE_ARCHITECTURES:
        return None, f"{arch} is not one of the native families ({', '.join(NATIVE_ARCHITECTURES)})"
    activation = str(getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu"))
    act = _ACTIVATIONS.get(activation)
    if act is None:
        return None, f"its activation {activation!r} has no row kernel"
    if getattr(cfg, "use_bidirectional_attention", False):
        return None, "its attention is bidirectional"
    if getattr(cfg, "attn_logit_softcapping", None):
        return None, "its attention scores are soft-capped"
    base = model.base_model
    heads = cfg.num_attention_heads
    gemma = arch in _GEMMA
    per_type = "layer_type" in inspect.signature(base.rotary_emb.forward).parameters
    layers = [_layer(layer, i, cfg, gemma, max_len, per_type) for i, layer in enumerate(base.layers)]
    if any(isinstance(layer, str) for layer in layers):
        return None, next(layer for layer in layers if isinstance(layer, str))
    scalar = getattr(cfg, "query_pre_attn_scalar", None)
    spec = DecoderSpec(
        family=arch.removesuffix("ForCausalLM"), heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        activation=act, sandwich=gemma,
        embed_scale=float(cfg.hidden_size) ** 0.5 if gemma else None,
        attn_scale=float(scalar) ** -0.5 if scalar else None,
        softcap=getattr(cfg, "final_logit_softcapping", None),
        layers=[layer for layer in layers if not isinstance(layer, str)],
        final_norm=_norm(base.norm, gemma))
    return spec, ""


def check_transformers_path(model: HFModule, why_not: str, head_rows: list[int] | None) -> None:
    """Refuse what only the native path runs on a model ``describe`` turned down, and say in the
    log which promises the transformers path does not keep."""
    if head_rows:
        raise ValueError("a reduced draft vocabulary needs the native path")
    if hasattr(model, BLOCKS_ATTRIBUTE):
        raise ValueError(f"{type(model).__name__} was read from its GGUF file for the native path, which does not "
                         f"run it ({why_not}); load it converted (--quantize none)")
    logger.warning("%s runs on the transformers path (%s): its rows may change in the last bits with what is batched "
                   "beside them (greedy output can differ from running alone at near-ties), answers are not kept in "
                   "the prefix cache, and there are no token trees and no CUDA decode graphs", type(model).__name__,
                   why_not)


def _layer(layer: HFModule, index: int, cfg, gemma: bool, max_len: int, rope_per_type: bool) -> LayerSpec | str:
    """``rope_per_type``: the rotary module keeps a table per layer type (Gemma 3's local and
    global bases)."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv = [attn.qkv_proj] if hasattr(attn, "qkv_proj") else [attn.q_proj, attn.k_proj, attn.v_proj]
    gate_up = [mlp.gate_up_proj] if hasattr(mlp, "gate_up_proj") else [mlp.gate_proj, mlp.up_proj]
    norms = {"input": _norm(layer.input_layernorm, gemma)}
    if gemma:
        norms["post_attention"] = _norm(layer.post_attention_layernorm, gemma)
        norms["mlp"] = _norm(layer.pre_feedforward_layernorm, gemma)
        norms["post_mlp"] = _norm(layer.post_feedforward_layernorm, gemma)
    else:
        norms["mlp"] = _norm(layer.post_attention_layernorm, gemma)
    for name in ("q", "k"):
        if (norm := getattr(attn, f"{name}_norm", None)) is not None:
            norms[name] = _norm(norm, gemma)
    layer_types = getattr(cfg, "layer_types", None)
    kind = layer_types[index] if layer_types else "full_attention"
    window = None
    if kind == "sliding_attention":
        window = getattr(cfg, "sliding_window", None)
    elif kind != "full_attention":
        return f"layer {index} is a {kind!r} layer"
    elif layer_types is None and getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        window = cfg.sliding_window  # a config without layer types windows every layer (Mistral)
    if window is not None and window >= max_len:
        window = None  # no request is long enough for the window to matter
    return LayerSpec(qkv, attn.o_proj, gate_up, mlp.down_proj, norms, window, kind if rope_per_type else "")


def _norm(module: HFModule, gemma: bool) -> Norm:
    weight = module.weight.detach()
    eps = getattr(module, "variance_epsilon", None) or module.eps
    if gemma:  # Gemma scales by (1 + w), in float32 (its norm computes that way)
        weight = (1.0 + weight.float()).to(weight.dtype)
    return Norm(weight.contiguous(), float(eps))


def rope_tables(model: HFModule, max_len: int, like: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin for every position, by rotary table name ("" for a model with one), computed once by
    the model's own rotary module (so every RoPE variant transformers knows is honoured) and then
    only indexed: a row's rotation never depends on how many rows share the call.

    LongRoPE (Phi-3) switches transformers from the short to the long factors for a whole
    sequence once it outgrows ``original_max_position_embeddings``; a table has one row per
    position, so positions below it take the short factors and the rest the long ones (as vLLM
    does): equal to transformers for every request that stays below it."""
    rotary = model.base_model.rotary_emb
    cfg = model.config
    positions = torch.arange(max_len, device=like.device)[None]
    x = like[:1].float()
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        tables = {kind: rotary(x, positions, kind) for kind in sorted(set(cfg.layer_types))}
    else:
        cos, sin = rotary(x, positions)
        original = (getattr(cfg, "rope_parameters", None) or {}).get("original_max_position_embeddings")
        if getattr(rotary, "rope_type", "") == "longrope" and original and max_len > original:
            short_cos, short_sin = rotary(x, positions[:, :original])
            cos, sin = torch.cat([short_cos, cos[:, original:]], 1), torch.cat([short_sin, sin[:, original:]], 1)
        tables = {"": (cos, sin)}
    return {kind: (cos[0].to(like.dtype), sin[0].to(like.dtype)) for kind, (cos, sin) in tables.items()}
