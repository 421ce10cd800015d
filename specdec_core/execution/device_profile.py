"""How the models run on this device, decided once per engine: device, dtype, linear kernels,
attention layout, row kernels and decode graphs.

Why one object: each of these follows from the device and dtype (and the flags), and each used to
be re-derived where it was needed (the loader, the engine, the runner, the decoder, the attention
and the kernels asked ``device.type == "cuda"`` on their own), so a new device or kernel set meant
finding every such ``if``. Now ``DeviceProfile.decide`` makes every choice, refuses the
combinations that cannot run, and ``describe`` says in one log line what this process runs.

The choices:

- device ``auto``: CUDA when present, else the CPU. dtype ``auto``: bf16 on CUDA (halves the
  memory traffic), fp32 on the CPU (its bf16 GEMMs are slow and its kernels are fp32).
- kernels (``--quantize``): on the CPU in fp32, ``gguf`` where the AVX2 block kernels run (a GGUF
  model's own blocks, Q8_0 blocks made at load for everything else), per-row ``int8`` where they
  are not vectorized; ``none`` (the model's dtype, oneDNN on the CPU, cuBLAS on CUDA) elsewhere.
  Why not int8 by default: per-row int8 garbles small models (SmolLM2-135M) and is further from
  fp32 than a 4-bit GGUF on the 1.5B (docs/benchmarks.md), while Q8_0 (one scale per 32 weights)
  stays close and is batch-invariant like the rest.
- attention: ``segments`` on the CPU (a draft is attended by exactly the call that scores it
  decoded alone: bit-identical rows), ``packed`` on CUDA (one call per layer: launch-bound).
- row kernels: the C row ops and one-row attention (``row_kernels``, ``attention``) where the C
  library is built and vectorized, on the CPU in fp32.
- decode graphs: bucketed static shapes for the packed path (``decode_graphs``), ``auto`` on
  CUDA, and captured as CUDA graphs there only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from specdec_core.execution.linear_kernels import Quantize
from specdec_core.kernels import c_library

AttentionLayout = Literal["segments", "packed"]

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
# The one-row attention kernel keeps a head's scores and values on the stack up to this size.
_ROW_ATTENTION_MAX_HEAD_DIM = 512


class ProfileError(ValueError):
    """The device, dtype, kernels or layout asked for cannot run here; the message says why."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` picks CUDA when present, else the CPU; asking for absent CUDA fails early."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"device {device!r} requested but CUDA is not available")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"`` is bf16 on CUDA and fp32 on the CPU (see the module docstring)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ProfileError(f"unknown dtype {dtype!r}; expected auto or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def resolve_kernels(quantize: str, device: torch.device, dtype: torch.dtype) -> Quantize:
    """The linear kernels for ``--quantize`` on this device (see the module docstring); ``int8``
    and ``gguf`` off the CPU in fp32 are refused, as is ``gguf`` where the C library is missing."""
    if quantize not in ("auto", "none", "int8", "gguf"):
        raise ProfileError(f"unknown quantize {quantize!r}; expected 'auto', 'none', 'int8' or 'gguf'")
    cpu_fp32 = device.type == "cpu" and dtype == torch.float32
    if quantize == "auto":
        if not cpu_fp32:
            return "none"
        return "gguf" if c_library.vectorized() else "int8"
    if quantize in ("int8", "gguf") and not cpu_fp32:
        raise ProfileError(f"quantize={quantize!r} (quantized CPU kernels) runs only on the CPU in float32, "
                           f"not on {device} in {dtype}; use quantize='none' there")
    if quantize == "gguf" and not c_library.available():
        raise ProfileError("quantize='gguf' needs the C block kernels, which could not be built or loaded")
    return "int8" if quantize == "int8" else quantize  # type: ignore[return-value]


@dataclass(frozen=True)
class DeviceProfile:
    """Every per-device choice of an engine's models (see the module docstring)."""

    device: torch.device
    dtype: torch.dtype
    kernels: Quantize
    attention: AttentionLayout
    row_kernels: bool  # the C row ops and one-row attention run (CPU, fp32, vectorized library)
    decode_graphs: bool  # packed forwards run in bucketed static shapes (``decode_graphs``)
    capture_graphs: bool  # ... captured as CUDA graphs

    @classmethod
    def decide(cls, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto", quantize: str = "auto",
               attention: str = "auto", decode_graphs: str = "auto", kernel_set: str = "auto") -> DeviceProfile:
        """Make every choice from the flags (each ``auto`` by the device), or say why one cannot run.
        ``kernel_set`` other than ``auto`` selects the C kernel set for the whole process
        (``c_library.select_kernels``); ``auto`` keeps the one it runs (``SPECDEC_KERNELS`` or the best)."""
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        if kernel_set != "auto":
            try:
                c_library.select_kernels(kernel_set)
            except (ValueError, RuntimeError) as exc:
                raise ProfileError(str(exc)) from exc
        kernels = resolve_kernels(quantize, dev, dt)
        if attention not in ("auto", "segments", "packed"):
            raise ProfileError(f"unknown attention {attention!r}; expected 'auto', 'segments' or 'packed'")
        layout: AttentionLayout = ("packed" if dev.type == "cuda" else "segments") if attention == "auto" else attention  # type: ignore[assignment]
        if decode_graphs not in ("auto", "on", "off"):
            raise ProfileError(f"unknown decode_graphs {decode_graphs!r}; expected 'auto', 'on' or 'off'")
        if decode_graphs == "on" and layout != "packed":
            raise ProfileError("--decode-graphs on needs packed attention (--attention packed)")
        graphs = layout == "packed" and (decode_graphs == "on" or (decode_graphs == "auto" and dev.type == "cuda"))
        rows = dev.type == "cpu" and dt == torch.float32 and c_library.vectorized()
        return cls(dev, dt, kernels, layout, rows, graphs, graphs and dev.type == "cuda")

    @classmethod
    def of_model(cls, model: torch.nn.Module, quantize: str = "auto", attention: str = "auto",
                 decode_graphs: str = "auto", kernel_set: str = "auto") -> DeviceProfile:
        """The profile for a model already loaded: its parameters' device and dtype."""
        param = next(model.parameters())
        return cls.decide(param.device, param.dtype, quantize, attention, decode_graphs, kernel_set)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def row_attention(self, head_dim: int) -> bool:
        """Whether every row is attended by its own C call (``attention.attend_rows``)."""
        return self.row_kernels and self.attention == "segments" and head_dim <= _ROW_ATTENTION_MAX_HEAD_DIM

    def describe(self) -> str:
        """One log line: what this process runs."""
        graphs = "CUDA graphs" if self.capture_graphs else "bucketed shapes" if self.decode_graphs else "eager"
        return (f"device {self.device} ({str(self.dtype).removeprefix('torch.')}), linear kernels {self.kernels}, "
                f"{self.attention} attention, row kernels {'on' if self.row_kernels else 'off'}, "
                f"decode {graphs}; {_c_library()}")


def _c_library() -> str:
    """The C library's part of the log line: its build, the kernel set it runs, what the CPU has."""
    if not c_library.available():
        return "C library unavailable"
    return (f"C library {c_library.build()}, kernels {c_library.active_kernels()} "
            f"(CPU: {' '.join(c_library.cpu_features()) or 'none of avx2, avx512'})")
