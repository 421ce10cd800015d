"""The AMX-INT8 kernel set where the CPU has no AMX: a build of the C library whose tile products are
emulated in C (``csrc/amx_emulation.h``) runs the AMX set's own code around them (the weights
unpacked into tile rows, the sums' layout, the float folds), so the tests that hold every set to
the same bits hold the AMX set to them on any machine with AVX-512 VNNI, not only on the Intel
hosts that have AMX. Where the CPU has AMX the same tests also run on the real tiles
(test_gguf_blocks.py), and here they check the emulation against them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_core.kernels import c_library
from specdec_core.kernels.build_definition import AMX_EMULATION, AMX_EMULATION_SUFFIX, compile_command, sources_hash

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not c_library.available() or "avx512-vnni" not in c_library.cpu_features(),
                                reason="the AMX set's emulation runs on AVX-512 VNNI")


@pytest.fixture(scope="module")
def emulation_build(tmp_path_factory) -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the emulation with")
    out = tmp_path_factory.mktemp("amx-emulation") / "libkernels-amx-emulation.so"
    cmd = compile_command(compiler, out, sources_hash() + AMX_EMULATION_SUFFIX, AMX_EMULATION)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_the_amx_set_passes_the_block_kernel_tests_on_its_emulation(emulation_build):
    """test_gguf_blocks.py's tests of the AMX set (against the dequantized product, a row's bits
    alone and in 1..16 rows, the repacked formats) and the one that compares every vector set's
    bits, in a process that loads the emulation build; none of them may skip."""
    env = {**os.environ, c_library.LIBRARY_ENV: str(emulation_build), c_library.KERNELS_ENV: "auto"}
    code = ("from specdec_core.kernels import c_library\n"
            "print(c_library.active_kernels(), c_library.build())\n")
    probe = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split() == ["amx-int8", sources_hash() + AMX_EMULATION_SUFFIX]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "amx-int8 or vector_sets",
                           "tests/execution/test_gguf_blocks.py"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-4000:]
    assert "skipped" not in summary, summary
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 40, summary  # 4 tests x 9 kernels (6 repacked) of the AMX set + 9 comparisons
