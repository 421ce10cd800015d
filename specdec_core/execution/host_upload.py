"""Everything the host knows about a step, copied to the device in one transfer.

On CUDA each ``torch.tensor(..., device=...)`` is a blocking copy that waits for the whole queue, so
a step that uploads token ids, positions, cache rows, sampling parameters and uniforms separately
stalls once per upload per forward. Here the values of a whole step are appended to one flat int64
buffer (floats as their float64 bit patterns, so one buffer holds both) and sent once; every
consumer gets a view of its own range. On the CPU the "copy" is free, and the same code runs.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ref:
    """A range of the uploaded buffer: ``count`` values from ``offset``, ints or float64s."""

    offset: int
    count: int
    floats: bool = False


class HostUpload:
    """Collects int and float values, sends them in one copy, then hands out device views."""

    def __init__(self) -> None:
        self._values = array("q")
        self._data: torch.Tensor | None = None

    def ints(self, values: Iterable[int]) -> Ref:
        start = len(self._values)
        self._values.extend(values)
        return Ref(start, len(self._values) - start)

    def floats(self, values: Iterable[float]) -> Ref:
        bits = array("q", array("d", values).tobytes())
        start = len(self._values)
        self._values.extend(bits)
        return Ref(start, len(bits), floats=True)

    def send(self, device: torch.device) -> "HostUpload":
        """One host-to-device copy (asynchronous from pinned memory on CUDA)."""
        host = torch.frombuffer(bytearray(self._values.tobytes()) or bytearray(8), dtype=torch.int64)
        if device.type == "cuda":
            host = host.pin_memory()
        # On the CPU this is a no-op, kept so that the step's counted upload is the same call.
        self._data = host.to(device, non_blocking=True)
        return self

    def __getitem__(self, ref: Ref) -> torch.Tensor:
        if self._data is None:
            raise RuntimeError("HostUpload read before send()")
        view = self._data[ref.offset:ref.offset + ref.count]
        return view.view(torch.float64) if ref.floats else view
