"""How the C library is built, written once: its sources, their hash, the compiler flags.

Two builds read it: ``setup.py`` (the optional extension built at install) and ``c_library``
(the same sources compiled with ``cc`` on first use, where the install had no compiler). They
must agree: ``c_library`` loads the installed extension only when the source hash compiled into
it is the hash of the sources beside it, so a list, order or hash that differed between the two
would make every start compile the library afresh. Standard library only: ``setup.py`` loads
this file by path, without torch and without the package ``__init__`` files above it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
# The extension setup.py builds: an empty Python module around the library (``PY_MODULE``), so
# that setuptools compiles and installs it; Python calls the library through ctypes.
EXTENSION = "specdec_core.kernels._c_library"
PY_MODULE = "gguf_module.c"
# The folder is the list: every C file but the module wrapper, every header, each sorted (the
# hash reads them in this order).
SOURCES = tuple(sorted(p.name for p in CSRC.glob("*.c") if p.name != PY_MODULE))
HEADERS = tuple(sorted(p.name for p in CSRC.glob("*.h")))
# No FMA contraction: a row's float steps must be the same in every tile instantiation.
COMPILE_FLAGS = ("-O3", "-ffp-contract=off", "-pthread")
LINK_FLAGS = ("-pthread",)
LIBRARIES = ("m", "dl")
# A shared library compiled outside setuptools (which adds the last two itself); also what
# clients/tools/gguf_kernel_ab.py compiles its A/B builds with.
CFLAGS = (*COMPILE_FLAGS, "-fPIC", "-shared")


def sources_hash() -> str:
    """sha256 of the sources and headers (16 hex digits), compiled into the library
    (``sd_gguf_sources_hash``) so that a build can be told from another."""
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((CSRC / name).read_bytes())
    return digest.hexdigest()[:16]


def hash_define(digest: str) -> str:
    """The compiler flag that gives the library its source hash."""
    return f'-DSD_SOURCES_HASH="{digest}"'


# A test build whose AMX tile products are emulated in C (csrc/amx_emulation.h), so that the AMX-INT8
# set runs, slowly, on any CPU with AVX-512 VNNI; its source hash carries this suffix, so that step
# costs timed with it are never taken for a real build's.
AMX_EMULATION = ("-DSD_AMX_EMULATE",)
AMX_EMULATION_SUFFIX = "+amx-emulation"


def compile_command(compiler: str, output: Path, digest: str, defines: tuple[str, ...] = ()) -> list[str]:
    """The command that compiles the sources into the shared library ``output`` (``c_library``'s
    first-use build; with ``AMX_EMULATION``, the tests' emulation build)."""
    return [compiler, *CFLAGS, *defines, hash_define(digest), "-o", str(output), *(str(CSRC / s) for s in SOURCES),
            *(f"-l{lib}" for lib in LIBRARIES)]


def extension_arguments(root: Path) -> dict:
    """``setuptools.Extension``'s arguments for the installed library; paths relative to ``root``
    (the folder of setup.py), as setuptools wants them."""
    relative = CSRC.resolve().relative_to(root.resolve()).as_posix()
    return {
        "name": EXTENSION,
        "sources": [f"{relative}/{name}" for name in (PY_MODULE, *SOURCES)],
        "depends": [f"{relative}/{name}" for name in HEADERS],
        "extra_compile_args": [*COMPILE_FLAGS, hash_define(sources_hash())],
        "extra_link_args": list(LINK_FLAGS),
        "libraries": list(LIBRARIES),
    }
