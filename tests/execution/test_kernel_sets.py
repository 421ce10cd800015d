"""Which C kernel set a process runs: what the CPU and OS support (cpuid, XCR0, AMX's permission),
``auto`` taking the best of it, ``SPECDEC_KERNELS`` overriding it, and the start-up line saying so.
The kernels' results on each set are compared bit for bit in test_gguf_blocks.py and test_row_kernels.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec_core.execution.device_profile import DeviceProfile, ProfileError
from specdec_core.kernels import c_library

pytestmark = pytest.mark.skipif(not c_library.available(), reason="the C kernels are not built here")


def _cpuinfo_flags() -> set[str]:
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        pytest.skip("no /proc/cpuinfo to compare with")
    line = next((ln for ln in info.read_text().splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@pytest.fixture(autouse=True)
def _back_to_auto():
    yield
    c_library.select_kernels("auto")


def test_cpu_features_agree_with_what_the_kernel_reports():
    """Linux lists a feature in /proc/cpuinfo only when the CPU has it and the OS saves its state,
    which is what ``sd_cpu_features`` checks itself; AMX also needs this process's permission."""
    flags = _cpuinfo_flags()
    features = c_library.cpu_features()
    assert ("avx2" in features) == ({"avx2", "fma", "f16c"} <= flags)
    assert ("avx512" in features) == ({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags)
    assert ("avx512-vnni" in features) == ("avx512" in features and "avx512_vnni" in flags)
    assert "amx-int8" not in features or {"amx_tile", "amx_int8"} <= flags


def test_auto_takes_the_best_set_this_cpu_runs_and_portable_is_always_there():
    features = c_library.cpu_features()
    best = next((s for s in ("avx512-vnni", "avx2") if s in features), "portable")
    if best == "avx512-vnni" and "amx-int8" in features:  # the AMX set needs the VNNI one beneath it
        best = "amx-int8"
    assert c_library.select_kernels("auto") == best == c_library.active_kernels()
    assert c_library.runnable_kernels() == list(c_library.KERNEL_SETS[c_library.KERNEL_SETS.index(best):])
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert best in ("avx2", "avx512-vnni", "amx-int8")
    for name in c_library.runnable_kernels():  # each set the CPU runs can be chosen, and reports itself
        assert c_library.select_kernels(name) == name == c_library.active_kernels()
    assert c_library.select_kernels("portable") == "portable" == c_library.active_kernels()
    assert not c_library.vectorized()  # so --quantize auto would not pick the portable kernels
    assert c_library.select_kernels("auto") == best


@pytest.mark.parametrize("name, says", [("avx512", "no kernels for it yet"), ("sse2", "not a kernel set"),
                                        ("AVX2", "not a kernel set"), ("amx_int8", "not a kernel set")])
def test_a_set_that_cannot_run_is_refused_by_name(name, says):
    """A feature without kernels of its own, or a name that is no set, is refused; so is a set this
    CPU lacks (each set needs the ones below it: AVX-512 VNNI's tiles take AVX2's for the rest)."""
    active = c_library.active_kernels()
    with pytest.raises(ValueError, match=says) as refused:
        c_library.select_kernels(name)
    assert "SPECDEC_KERNELS" in str(refused.value) and "auto" in str(refused.value)
    assert c_library.active_kernels() == active  # a refusal changes nothing
    for lacking in set(c_library.KERNEL_SETS) - set(c_library.runnable_kernels()):
        with pytest.raises(ValueError, match="this CPU lacks them"):
            c_library.select_kernels(lacking)


def test_the_environment_picks_the_set_for_the_process_and_the_start_up_line_names_it():
    """``SPECDEC_KERNELS`` is read when the library loads (a fresh process); the device profile's
    line, which the engine logs at start-up, names the set and the CPU's features."""
    code = ("from specdec_core.kernels import c_library\n"
            "from specdec_core.execution.device_profile import DeviceProfile\n"
            "print(c_library.active_kernels()); print(DeviceProfile.decide('cpu', 'float32', 'auto').describe())\n"
            "try:\n    c_library.select_kernels('bogus')\nexcept ValueError as exc:\n    print(exc)\n")
    env = {**os.environ, "SPECDEC_KERNELS": "portable"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    active, line, refusal = done.stdout.splitlines()[-3:]
    assert active == "portable"
    assert "kernels portable" in line and f"CPU: {' '.join(c_library.cpu_features())}" in line
    assert "linear kernels int8" in line  # the portable block kernels are not faster than int8, so --quantize auto skips them
    assert "'bogus'" in refusal


def test_the_engine_flag_selects_the_set_before_the_linear_kernels_are_chosen():
    """``--kernels`` (``EngineConfig.kernels``) reaches ``DeviceProfile.decide``, which picks the set
    first: on the portable set ``--quantize auto`` takes int8. ``auto`` leaves the process's set alone."""
    profile = DeviceProfile.decide("cpu", "float32", "auto", kernel_set="portable")
    assert c_library.active_kernels() == "portable" and profile.kernels == "int8" and not profile.row_kernels
    assert DeviceProfile.decide("cpu", "float32", "auto").kernels == "int8"  # still portable
    with pytest.raises(ProfileError, match="no kernels for it yet"):
        DeviceProfile.decide("cpu", "float32", "auto", kernel_set="avx512")
    for name in c_library.runnable_kernels()[:-1]:  # every vectorized set: --quantize auto takes gguf
        assert DeviceProfile.decide("cpu", "float32", "auto", kernel_set=name).kernels == "gguf"
        assert c_library.active_kernels() == name
