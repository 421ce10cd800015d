"""Q8_0 blocks made at load from a float weight, for the block kernels (``gguf_linear``).

Why: per-row int8 (``linear_kernels.RowInt8Linear``, one scale per output channel, 7-bit weights)
garbles small models (SmolLM2-135M's greedy ``def quicksort(arr):`` degenerates into
``return [xortortort...``) and on Qwen2.5-1.5B agrees with fp32 on only 0.945 of top-1 tokens,
worse than the 4-bit GGUF file. GGML's Q8_0 keeps one fp16 scale per 32 weights (8.5 bits a
weight). The block kernels multiply these blocks with activations quantized to 16 bits per 32
values (``kernels/csrc/gguf_q8_0_act16.c``), not with the 8-bit ones they give a GGUF file's blocks (as
llama.cpp does): on the 1.5B (950 positions, ``clients/tools/quant_quality.py``) Q8_0 with 8-bit
activations kept 0.988 of fp32's top-1 tokens (KL 0.0040 nats), with float32 activations 0.998
(KL 0.00013); the activations' rounding was the loss. A row's result never depends on the other
rows of the call: the same batch-invariance contract as every CPU kernel.
``--quantize gguf`` serves a GGUF file's own blocks and these blocks for every other layer; it is
the CPU default where the kernels are vectorized.

The quantization is the ``gguf`` package's, which is bit-exact to ggml's reference
(``quantize_row_q8_0_ref``): the weights are the ones llama.cpp would make of the same tensor.
It is done in row chunks so its float temporaries stay small (a 151,936-row head would
otherwise need several GB of them); one ``[8960 x 1536]`` weight takes ~0.1 s on the 2-core dev
machine (per-row int8's preparation 0.2 s), ~11 s for the 1.5B's 1.5 billion weights at that rate
(extrapolated, not timed end to end). A torch version was slower (0.5 s for that weight).
"""

from __future__ import annotations

import torch

from specdec_core.execution.gguf_linear import BlockWeight, GGUFLinear
from specdec_core.kernels import c_library

Q8_0 = 8  # GGML type id (gguf.GGMLQuantizationType.Q8_0)
BLOCK_VALUES = 32
_CHUNK_VALUES = 1 << 18  # values per quantizer call: 1 MB float32 temporaries (measured fastest)


def quantizable(weight: torch.Tensor) -> bool:
    """True when the kernels run Q8_0 rows of this weight's length (a multiple of 32)."""
    k = weight.shape[-1]
    return weight.dim() == 2 and k % BLOCK_VALUES == 0 and c_library.row_bytes(Q8_0, k) == k // BLOCK_VALUES * 34


def quantize_q8_0(weight: torch.Tensor) -> BlockWeight:
    """``weight`` [out, in] as Q8_0 blocks, one row of blocks per output row (ggml's bytes)."""
    from gguf import GGMLQuantizationType, quants

    w = weight.detach().float().contiguous()
    n, k = w.shape
    if k % BLOCK_VALUES:
        raise ValueError(f"Q8_0 needs rows of a multiple of {BLOCK_VALUES} values, not {k}")
    out = torch.empty(n, k // BLOCK_VALUES * 34, dtype=torch.uint8)
    src, dst = w.numpy(), out.numpy()
    rows = max(1, _CHUNK_VALUES // k)
    for start in range(0, n, rows):
        dst[start:start + rows] = quants.quantize(src[start:start + rows], GGMLQuantizationType.Q8_0)
    return BlockWeight(Q8_0, out, k)


def q8_0_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> GGUFLinear | None:
    """The block layer serving ``weight`` as Q8_0 with 16-bit activations, or None when the
    kernels cannot run its row length (the caller keeps its fallback)."""
    if not quantizable(weight):
        return None
    blocks = quantize_q8_0(weight)
    return GGUFLinear([BlockWeight(blocks.ggml_type, blocks.blocks, blocks.in_features, activation_bits=16)], bias)
