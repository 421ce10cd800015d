"""Builds the GGUF block kernels (``specdec_core/execution/csrc``) at install; everything else is in
pyproject.toml.

The extension is optional: without a C compiler the install still succeeds, and
``specdec_core.execution.gguf_kernels`` compiles the same sources on first use if a compiler appears later
(``--quantize gguf`` needs one of the two; every other mode needs neither).
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

CSRC = "specdec_core/execution/csrc/"
KERNEL_FILES = ("gguf_gemm.c", "gguf_act_quant.c", "gguf_scalar.c", "gguf_avx2.c", "gguf_x8.c", "gguf_x8_32.c", "gguf_x8_q6k.c", "gguf_threads.c", "row_attention.c", "row_ops.c", "gguf_kernels.h", "gguf_x8_common.h", "row_math.h")  # gguf_kernels.SOURCES + HEADERS
SOURCES_HASH = hashlib.sha256(b"".join((Path(__file__).parent / CSRC / f).read_bytes() for f in KERNEL_FILES)).hexdigest()[:16]

setup(
    ext_modules=[
        Extension(
            "specdec_core.execution._gguf_kernels",
            sources=[CSRC + name for name in ("gguf_module.c", "gguf_gemm.c", "gguf_act_quant.c", "gguf_scalar.c", "gguf_avx2.c", "gguf_x8.c", "gguf_x8_32.c", "gguf_x8_q6k.c", "gguf_threads.c", "row_attention.c", "row_ops.c")],
            depends=[CSRC + "gguf_kernels.h", CSRC + "gguf_x8_common.h", CSRC + "row_math.h"],
            # no FMA contraction: a row's float steps must be the same in every tile instantiation
            extra_compile_args=["-O3", "-ffp-contract=off", "-pthread", f'-DSD_SOURCES_HASH="{SOURCES_HASH}"'],
            extra_link_args=["-pthread"],
            libraries=["m", "dl"],
            optional=True,
        )
    ]
)
