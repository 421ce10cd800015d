"""The device profile: every per-device choice made once, and the combinations that cannot run
refused before a model loads."""

from __future__ import annotations

import pytest
import torch

from specdec_core.execution.device_profile import DeviceProfile, ProfileError, resolve_device, resolve_dtype, resolve_kernels
from specdec_core.kernels import c_library

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_device_and_dtype() -> None:
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", CPU) == torch.float32
    assert resolve_dtype("auto", CUDA) == torch.bfloat16
    assert resolve_dtype("float16", CPU) == torch.float16
    with pytest.raises(ProfileError, match="int4"):
        resolve_dtype("int4", CPU)
    if not torch.cuda.is_available():
        with pytest.raises(ProfileError, match="CUDA is not available"):
            resolve_device("cuda")


def test_kernels_are_the_block_kernels_on_the_cpu_and_quantized_ones_refused_elsewhere() -> None:
    """Any model on the CPU in fp32 gets the block kernels where they are vectorized (Q8_0 made at
    load for a model not from a GGUF file: per-row int8 garbles small models), per-row int8 where
    they are not; the model's own dtype everywhere else."""
    expected = "gguf" if c_library.vectorized() else "int8"
    assert resolve_kernels("auto", CPU, torch.float32) == expected
    assert resolve_kernels("auto", CUDA, torch.bfloat16) == "none"
    assert resolve_kernels("auto", CPU, torch.bfloat16) == "none"
    assert resolve_kernels("none", CPU, torch.float32) == "none"
    assert resolve_kernels("int8", CPU, torch.float32) == "int8"
    for quantize in ("int8", "gguf"):
        with pytest.raises(ProfileError, match=quantize):
            resolve_kernels(quantize, CPU, torch.bfloat16)
        with pytest.raises(ProfileError, match=quantize):
            resolve_kernels(quantize, CUDA, torch.float32)
    with pytest.raises(ProfileError, match="int4"):
        resolve_kernels("int4", CPU, torch.float32)


def test_the_cpu_profile_keeps_rows_alone_and_refuses_graphs_without_packed_attention() -> None:
    cpu = DeviceProfile.decide("cpu", "auto", "auto")
    assert (cpu.attention, cpu.decode_graphs, cpu.capture_graphs, cpu.cuda) == ("segments", False, False, False)
    assert cpu.row_kernels == c_library.vectorized()
    assert cpu.row_attention(64) == cpu.row_kernels and not cpu.row_attention(1024)
    bf16 = DeviceProfile.decide("cpu", "bfloat16", "auto")
    assert bf16.kernels == "none" and not bf16.row_kernels and not bf16.row_attention(64)
    # bucketed shapes on the CPU are what the decode-graph tests run; never captured there
    packed = DeviceProfile.decide("cpu", "float32", "none", "packed", "on")
    assert (packed.attention, packed.decode_graphs, packed.capture_graphs) == ("packed", True, False)
    assert not packed.row_attention(64)
    assert not DeviceProfile.decide("cpu", "float32", "none", "packed", "auto").decode_graphs
    with pytest.raises(ProfileError, match="packed attention"):
        DeviceProfile.decide("cpu", "float32", "none", "segments", "on")
    with pytest.raises(ProfileError, match="attention"):
        DeviceProfile.decide("cpu", "float32", "none", "flash")
    described = cpu.describe()
    assert "device cpu (float32)" in described and f"linear kernels {cpu.kernels}" in described


def test_a_loaded_model_gets_the_profile_of_its_device_and_dtype() -> None:
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    profile = DeviceProfile.of_model(model)
    assert (profile.device, profile.dtype, profile.kernels) == (CPU, torch.bfloat16, "none")
    with pytest.raises(ProfileError, match="int8"):
        DeviceProfile.of_model(model, "int8")
