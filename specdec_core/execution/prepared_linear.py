"""The base of every linear layer prepared once at load (``linear_kernels``, ``gguf_linear``).

Its own module so that the kernels built on it import it from below: ``linear_kernels`` picks a
block layer (``q8_0_blocks`` -> ``gguf_linear``), and both of those derive from this class.
"""

from __future__ import annotations

import torch


class PreparedLinear(torch.nn.Module):
    """A linear layer whose weight was laid out once for one kernel; ``forward`` is row-invariant
    on the CPU kernels (see ``linear_kernels``)."""

    kernel: str

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"
