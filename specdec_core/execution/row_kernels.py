"""A layer's row-wise float32 operations as one C call each (``kernels/csrc/row_ops.c``): RMS norm,
rotary embedding, gated product (SiLU or GELU).

Why: on the CPU a one-token step is bound by the bytes of weights it streams (~60 ms for the
1.5B here), and the torch forms of these operations added ~250 small ops and ~16 ms to it
(``torch.profiler``; docs/execution-measurements.md, "The rest of the step"): an RMS norm of 1,536 values was ~75 us of pow/mean/rsqrt/mul,
nearly all per-op overhead. Each row is computed by one thread with one instruction sequence,
so rows stay bit-identical alone and batched.

``DeviceProfile.row_kernels`` decides once per engine whether they run (float32 on a CPU where
the C kernels are built and vectorized); elsewhere (CUDA, bfloat16) the torch forms in
``native_decoder`` run, which compute the same functions up to rounding.
"""

from __future__ import annotations

import torch

from specdec_core.kernels import c_library


def _rows(x: torch.Tensor) -> None:
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("the row kernels want float32 [rows, n] tensors with unit-stride rows")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` per row of ``x`` ``[T, n]``."""
    _rows(x)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    c_library.library().sd_rms_norm(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), weight.data_ptr(), eps,
                                       out.data_ptr(), out.stride(0), torch.get_num_threads())
    return out


def rope_(x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate, in place, the first ``heads`` heads of each row of ``x`` ``[T, >= heads * head_dim]``
    by the row's ``cos``/``sin`` ``[T, head_dim]`` (rotate-half form): the queries and keys of a
    fused QKV output in one call."""
    _rows(x)
    if cos.stride(1) != 1 or sin.stride() != cos.stride() or x.shape[1] < heads * head_dim:
        raise ValueError("rope_ wants [T, head_dim] cos/sin tables with unit-stride rows")
    c_library.library().sd_rope(x.data_ptr(), x.shape[0], x.stride(0), heads, head_dim, cos.data_ptr(),
                                   sin.data_ptr(), cos.stride(0))


# The gated products ``gate_mul`` computes, in the order of ``kernels/csrc/row_ops.c``'s SD_ACT_* codes.
ACTIVATIONS = ("silu", "gelu_tanh")


def gate_mul(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` per row of ``gate_up`` ``[T, 2n]`` = ``[gate | up]``; ``activation`` one
    of ``ACTIVATIONS`` (SiLU: Llama, Qwen, Phi; tanh-approximated GELU: Gemma)."""
    _rows(gate_up)
    n = gate_up.shape[1] // 2
    out = gate_up.new_empty(gate_up.shape[0], n)
    c_library.library().sd_gate_mul(gate_up.data_ptr(), gate_up.shape[0], n, gate_up.stride(0), out.data_ptr(),
                                       out.stride(0), ACTIVATIONS.index(activation), torch.get_num_threads())
    return out
