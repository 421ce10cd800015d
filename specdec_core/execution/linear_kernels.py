"""Linear layers prepared once at load for the device and the quantization mode.

The execution contract of specdec is that a token's logits do not depend on what else is in the
forward pass. For a linear layer that means: every output row is computed by the same arithmetic,
in the same order, whatever the number of rows in the call. Measured on this project's 2-core AVX2
CPU (torch 2.13, ``clients/tools/step_costs.py`` and the tests in ``tests/execution/test_batch_invariance.py``):

- ``F.linear`` in fp32 re-packs the weight on every multi-row call (a 5-row call costs ~3.5x a
  1-row one) and a row's result differs (~1e-6) between 1 and 8 rows;
- oneDNN with a weight reordered once is nearly flat in the number of rows and bit-identical for
  every M >= 2, but M = 1 takes a GEMV path with another summation order: one-row calls are padded
  to two rows, which costs little and makes every M agree;
- fbgemm int8 with a per-channel weight and a *per-row* activation scale (each row divided by its
  own max-abs before the quantized GEMM, multiplied back after) is bit-identical for every M and
  about 7x faster than fp32 per layer for one row (3.7x for a whole decode step of the 1.5B).
  ``torch.ao`` dynamic int8 uses one scale per call,
  so a row's output depends on the other rows: that mode is not offered any more. One scale per
  output channel garbles small models (SmolLM2-135M), so int8 is an opt-in: ``gguf`` mode gives
  a float weight Q8_0 blocks instead (one scale per 32 weights, ``q8_0_blocks``), run by the block
  kernels with the same per-row contract.

On CUDA the layer is a plain bf16/fp16/fp32 ``F.linear``; cuBLAS makes no row-invariance promise.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F

from specdec_core.execution.prepared_linear import PreparedLinear
from specdec_core.execution.q8_0_blocks import q8_0_linear

# "gguf": the GGUF block kernels (``gguf_linear``): a GGUF model's own blocks, and Q8_0 blocks made at
# load (``q8_0_blocks``) for every other layer (per-row int8 where a row is not a multiple of 32).
Quantize = Literal["none", "int8", "gguf"]

# fbgemm's quantized GEMM wants the activation as uint8 with a zero point; each row scaled into
# [-1, 1] and quantized with scale 1/127 and zero point 128 uses the symmetric int8 range.
_ROW_SCALE = 1.0 / 127.0
_ROW_ZERO_POINT = 128
# Weights use 7 bits (|q| <= 63). Without VNNI (this AVX2 CPU) fbgemm multiplies uint8 activations
# by int8 weights with vpmaddubsw, which adds each pair of products in *saturating* int16:
# 2 x 255 x 127 overflows, and the kernel then silently computes something else, and something
# else again on a CPU with VNNI. With |q| <= 63 a pair is at most 2 x 255 x 63 = 32130 < 32767: the
# kernel is exact integer arithmetic on every x86 CPU, so the int8 model is the same everywhere.
# ``clients/tools/quant_quality.py`` on this CPU, top-1 agreement with fp32 / KL, 8-bit -> 7-bit weights:
# SmolLM2-135M 0.807 / 0.222 -> 0.853 / 0.062; Qwen2.5-Coder-1.5B 0.961 / 0.106 -> 0.945 / 0.107;
# 0.5B 0.948 / 0.020 -> 0.939 / 0.018. Taking the bit from the activations instead (7-bit, scale
# 1/63) kept the kernel exact but cost far more on SmolLM2 (KL 0.21-0.31 on three prompts).
_WEIGHT_QMAX = 63


class OneDNNLinear(PreparedLinear):
    """fp32 on the CPU through a oneDNN weight reordered once."""

    kernel = "onednn-fp32"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        w = weight.detach().float().contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, 2)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        single = rows.shape[0] == 1
        if single:  # M = 1 would take the GEMV path, whose rounding differs from M >= 2
            rows = rows.expand(2, -1)
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed, self.bias, "none", [], "")
        if single:
            out = out[:1]
        return out.reshape(*shape[:-1], self.out_features)


class RowInt8Linear(PreparedLinear):
    """int8 weights (one scale per output channel, 7 bits: see ``_WEIGHT_QMAX``) times int8
    activations (one scale per row)."""

    kernel = "fbgemm-int8-per-row"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / _WEIGHT_QMAX).clamp(min=1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated, fbgemm is the measured fast path
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        # The bias is added after the per-row rescale, outside the quantized kernel.
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
        out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            (rows / scale).contiguous(), _ROW_SCALE, _ROW_ZERO_POINT, self.packed)
        out = out * scale
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)


class DenseLinear(PreparedLinear):
    """Plain ``F.linear`` in the model's dtype (CUDA; no row-invariance promise from cuBLAS)."""

    kernel = "dense"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        self.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def prepare_linear(weight: torch.Tensor, bias: torch.Tensor | None, quantize: Quantize) -> PreparedLinear:
    """The kernel for this weight's device and ``quantize`` mode (see the module docstring)."""
    if weight.device.type == "cpu":
        if quantize == "gguf":
            blocks = q8_0_linear(weight, bias)
            if blocks is not None:
                return blocks
        if quantize in ("int8", "gguf"):
            return RowInt8Linear(weight, bias)
        if weight.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            return OneDNNLinear(weight, bias)
    elif quantize in ("int8", "gguf"):
        raise ValueError(f"quantize={quantize!r} runs on the CPU only; CUDA serves bf16")
    return DenseLinear(weight, bias)


def prepare_linears(module: torch.nn.Module, quantize: Quantize) -> torch.nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` by its prepared kernel, in place.

    This is how the generic (transformers) execution path gets row-invariant linear layers; the
    native Llama-family path prepares its fused projections directly. In ``gguf`` mode the layers
    with executable file blocks were replaced before (``gguf_weights.prepare_block_linears``); the
    rest get Q8_0 blocks here.
    """
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, prepare_linear(child.weight, child.bias, quantize))
        else:
            prepare_linears(child, quantize)
    return module
