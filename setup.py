"""Builds the C library (``specdec_core/kernels/csrc``) at install; everything else is in
pyproject.toml.

The extension is optional: without a C compiler the install still succeeds, and
``specdec_core.kernels.c_library`` compiles the same sources on first use if a compiler appears later
(``--quantize gguf`` needs one of the two; every other mode needs neither).

What is built (sources, hash, flags) is ``specdec_core/kernels/build_definition.py``, which the
first-use build reads too; it is loaded here by path, since importing the package would import
torch, which setup.py cannot need.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("build_definition", ROOT / "specdec_core" / "kernels" / "build_definition.py")
assert _spec is not None and _spec.loader is not None
build_definition = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_definition)

setup(ext_modules=[Extension(**build_definition.extension_arguments(ROOT), optional=True)])
