"""Builds the GGUF block kernels (``specdec_core/execution/csrc``) at install; everything else is in
pyproject.toml.

The extension is optional: without a C compiler the install still succeeds, and
``specdec_core.execution.gguf_kernels`` compiles the same sources on first use if a compiler appears later
(``--quantize gguf`` needs one of the two; every other mode needs neither).
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

CSRC = Path(__file__).parent / "specdec_core" / "execution" / "csrc"
# The folder is the list, read as ``gguf_kernels.SOURCES`` and ``HEADERS`` read it (that module
# imports torch, which setup.py cannot need): every C file but the Python module wrapper, every header.
PY_MODULE = "gguf_module.c"
SOURCES = sorted(p.name for p in CSRC.glob("*.c") if p.name != PY_MODULE)
HEADERS = sorted(p.name for p in CSRC.glob("*.h"))
SOURCES_HASH = hashlib.sha256(b"".join((CSRC / f).read_bytes() for f in SOURCES + HEADERS)).hexdigest()[:16]
RELATIVE = "specdec_core/execution/csrc/"  # setuptools wants paths relative to setup.py

setup(
    ext_modules=[
        Extension(
            "specdec_core.execution._gguf_kernels",
            sources=[RELATIVE + name for name in [PY_MODULE, *SOURCES]],
            depends=[RELATIVE + name for name in HEADERS],
            # no FMA contraction: a row's float steps must be the same in every tile instantiation
            extra_compile_args=["-O3", "-ffp-contract=off", "-pthread", f'-DSD_SOURCES_HASH="{SOURCES_HASH}"'],
            extra_link_args=["-pthread"],
            libraries=["m", "dl"],
            optional=True,
        )
    ]
)
