"""A linear layer that executes a GGUF file's own quantized blocks (``--quantize gguf``).

The weight stays in the file's block format (Q4_K, Q6_K, Q8_0, ...): fewer bytes per weight than
int8 (4.5 bits for Q4_K against 8), and no second rounding: the model served is the model the user
downloaded. The activations are quantized to 8 bits per row inside the kernel
(``c_library``), as llama.cpp does, so every output row depends only on its own input row, bit
for bit, whatever the number of rows in the call: the same contract as the other CPU kernels
(``linear_kernels``). Q8_0 blocks made at load from a float weight get 16-bit activations instead
(``activation_bits``, ``q8_0_blocks``): same contract, closer to fp32.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from specdec_core.execution.prepared_linear import PreparedLinear
from specdec_core.kernels import c_library


@dataclass(frozen=True)
class BlockWeight:
    """The blocks of one weight matrix: ``blocks[i]`` is output row ``i`` (HF module order)."""

    ggml_type: int
    blocks: torch.Tensor  # uint8 [out_features, row_bytes]
    in_features: int
    # the activations' bits in the kernel: 8 (as llama.cpp), or 16 (Q8_0 only; ``q8_0_blocks``)
    activation_bits: int = 8

    @property
    def out_features(self) -> int:
        return int(self.blocks.shape[0])

    @property
    def type_name(self) -> str:
        return c_library.SUPPORTED_TYPES.get(self.ggml_type, str(self.ggml_type))

    def rows(self, index: torch.Tensor | list[int]) -> "BlockWeight":
        """Only the output rows ``index``, in that order (a row of blocks is self-contained)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.blocks.device)
        return BlockWeight(self.ggml_type, self.blocks.index_select(0, index).contiguous(), self.in_features,
                           self.activation_bits)

    def dequantize_rows(self, index: torch.Tensor) -> torch.Tensor:
        """Float32 rows ``index`` of the weight: a token embedding served from its blocks (each
        row is dequantized on its own, so a row never depends on the others looked up with it)."""
        from gguf import GGMLQuantizationType, quants

        rows = self.blocks.index_select(0, index.to(self.blocks.device)).numpy()
        return torch.from_numpy(quants.dequantize(rows, GGMLQuantizationType(self.ggml_type)).astype("float32"))

    def dequantize(self) -> torch.Tensor:
        """The whole weight in float32 ``[out_features, in_features]``."""
        return self.dequantize_rows(torch.arange(self.out_features))


LINEAR_CALLS = 4  # SD_LINEAR_CALLS: kernel calls of one fused linear (neighbouring parts of one format merge)
_i32, _i64, _ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p


class BlockCalls(ctypes.Structure):
    """A ``GGUFLinear`` as the C library takes it (``sd_linear`` of ``kernels/csrc/gguf_kernels.h``): its
    kernel calls, each writing the next columns of the output, and the bias. One C function
    (``sd_block_linear``) runs it, for ``GGUFLinear.forward`` and inside the one-call decoder
    stack (``row_layers``) alike."""

    _fields_ = [("codes", _i32 * LINEAR_CALLS), ("weights", _ptr * LINEAR_CALLS), ("rows", _i64 * LINEAR_CALLS),
                ("calls", _i32), ("in_features", _i64), ("out_features", _i64), ("bias", _ptr)]


def executable(weight: BlockWeight) -> bool:
    """True when the kernels run this format with this row length (and these activations)."""
    if weight.ggml_type not in c_library.SUPPORTED_TYPES:
        return False
    if weight.activation_bits not in (8, 16):
        return False
    if weight.activation_bits == 16 and weight.ggml_type not in c_library.ACT16_TYPES:
        return False
    return c_library.row_bytes(weight.ggml_type, weight.in_features) == weight.blocks.shape[1]


class GGUFLinear(PreparedLinear):
    """Concatenated outputs of one or more block weights (a fused QKV may mix Q4_K and Q6_K), each
    computed by the block kernel straight into its columns of one output tensor."""

    kernel = "gguf-blocks"

    def __init__(self, parts: list[BlockWeight], bias: torch.Tensor | None) -> None:
        in_features = parts[0].in_features
        if any(p.in_features != in_features for p in parts):
            raise ValueError("fused block weights must share in_features")
        merged: list[BlockWeight] = []
        for part in parts:  # neighbours of one format become one kernel call
            if not executable(part):
                raise ValueError(f"the block kernels cannot run {part.type_name} with {in_features} inputs")
            if merged and (merged[-1].ggml_type, merged[-1].activation_bits) == (part.ggml_type, part.activation_bits):
                last = merged.pop()
                part = BlockWeight(part.ggml_type, torch.cat([last.blocks, part.blocks]), in_features,
                                   part.activation_bits)
            merged.append(BlockWeight(part.ggml_type, part.blocks.contiguous(), in_features, part.activation_bits))
        super().__init__(in_features, sum(p.out_features for p in merged))
        self.formats = [p.type_name + (" (16-bit act)" if p.activation_bits == 16 else "") for p in merged]
        # (type code, bytes, output rows) per kernel call, in the active kernels' fastest layout;
        # the file's layout is not kept beside a repacked copy
        self.calls: list[tuple[int, torch.Tensor, int]] = []
        for part in merged:
            kind = part.ggml_type | (c_library.ACT16 if part.activation_bits == 16 else 0)
            packed = c_library.repack(kind, part.blocks, in_features)
            code, data = packed if packed is not None else (kind, part.blocks)
            self.calls.append((code, data, part.out_features))
        self.bias = None if bias is None else bias.detach().float().contiguous()
        if len(self.calls) > LINEAR_CALLS:
            raise ValueError(f"a fused block linear takes at most {LINEAR_CALLS} runs of one format, not "
                             f"{'+'.join(self.formats)}")
        self.desc = BlockCalls()  # points into self.calls' tensors and self.bias, kept as long as self
        for i, (code, data, rows) in enumerate(self.calls):
            self.desc.codes[i], self.desc.weights[i], self.desc.rows[i] = code, data.data_ptr(), rows
        self.desc.calls, self.desc.in_features, self.desc.out_features = len(self.calls), in_features, self.out_features
        self.desc.bias = None if self.bias is None else self.bias.data_ptr()
        self._desc_at = ctypes.addressof(self.desc)

    def extra_repr(self) -> str:
        types = "+".join(self.formats)
        return f"{super().extra_repr()}, blocks={types}"

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads (for bandwidth ratios)."""
        return sum(data.numel() for _, data, _ in self.calls)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or rows.stride(-1) != 1:
            rows = rows.float().contiguous()
        m = rows.shape[0]
        out = torch.empty(m, self.out_features, dtype=torch.float32)
        c_library.block_linear(self._desc_at, rows.data_ptr(), m, rows.stride(0), out.data_ptr())
        return out.reshape(*shape[:-1], self.out_features)
