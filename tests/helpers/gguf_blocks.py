"""Valid GGUF blocks of each format for kernel tests, made from seeded random numbers: the
``gguf`` package's quantizer where it has one, else random bits with small positive scales."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from specdec_core.kernels import c_library

T = GGMLQuantizationType
K_QUANTS = {T.Q4_K, T.Q5_K, T.Q6_K}


def blocks_for(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """Valid blocks of ``qtype``: the gguf quantizer where it has one, else random bits (every bit
    pattern of a K-quant block is a valid block) with small positive fp16 super-block scales.
    ``scale`` multiplies the values (a model's weights want ~0.05, not ~1)."""
    rng = np.random.default_rng(seed)
    if qtype not in K_QUANTS:
        return quants.quantize(scale * rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scales = (scale * rng.uniform(0.002, 0.02, size=(rows, cols // block, 2))).astype(np.float16).view(np.uint8)
    if qtype == T.Q6_K:
        raw[..., 208:210] = scales[..., :2]
    else:  # d and dmin lead the Q4_K / Q5_K block
        raw[..., 0:4] = scales
    return raw.reshape(rows, -1)


def use_kernel_set(name: str) -> None:
    """Run the C kernel set ``name`` in this process; a set this CPU lacks skips the test, saying
    what the CPU has (tests parametrized over ``c_library.KERNEL_SETS``)."""
    if name not in c_library.runnable_kernels():
        pytest.skip(f"this CPU does not run the {name} kernels (it has: {' '.join(c_library.cpu_features()) or 'none'})")
    c_library.select_kernels(name)
