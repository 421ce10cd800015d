"""The decoder stack of a CPU forward whose rows are all one-row attention segments, as one C
call (``kernels/csrc/decode_rows.c``): what ``native_decoder.DecoderLayer`` computes with the C row
kernels and the GGUF block kernels, without going back to Python between operations.

Why: on a small model the Python around the matrix products costs as much as the products. On
the 2-core AMD EPYC dev machine a Gemma 3 270M decode step spent a quarter of its time in ~40
Python-level calls per layer (norms, per-head norms, rotation, splits, cache writes, attention,
residual adds) next to ~4 ms of layer weights to stream; a draft model pays the same per
proposed token.

When it runs: the engine's CPU default (float32, ``--quantize gguf``, the C row kernels and
one-row attention), where every row of every forward is its own attention segment
(``ModelRunner.rows_alone``): decode rows, drafts, and prompts fed row by row. Elsewhere (CUDA,
``int8``/``none``, packed attention) the per-op path runs. Each C operation is the function the
per-op path calls, so a row's bits are the same on both paths (``tests/execution/test_row_layers.py``).

The ctypes Structures below mirror ``kernels/csrc/decode_rows.h`` field for field.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import cast

import torch

from specdec_core.execution import row_kernels
from specdec_core.execution.attention import RowAttention
from specdec_core.execution.decoder_families import DecoderSpec
from specdec_core.execution.gguf_linear import BlockCalls, GGUFLinear
from specdec_core.execution.kv_cache import PagedKVCache
from specdec_core.kernels import c_library

STEP_TABLES, STEP_WINDOWS = 4, 4  # SD_STEP_TABLES, SD_STEP_WINDOWS
LINEARS = ("qkv", "o", "gate_up", "down")  # a layer's block linears, in _Layer's order
_i64, _i32, _f32, _ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


class _Norm(ctypes.Structure):
    _fields_ = [("weight", _ptr), ("eps", _f32)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", BlockCalls), ("o", BlockCalls), ("gate_up", BlockCalls), ("down", BlockCalls),
                ("input", _Norm), ("q", _Norm), ("k", _Norm), ("post_attention", _Norm), ("mlp", _Norm),
                ("post_mlp", _Norm), ("keys", _ptr), ("values", _ptr), ("head_stride", _i64), ("table", _i32),
                ("window", _i32)]


class _Step(ctypes.Structure):
    _fields_ = [("x", _ptr), ("tokens", _i64), ("hidden", _i64), ("heads", _i32), ("kv_heads", _i32),
                ("head_dim", _i32), ("activation", _i32), ("sandwich", _i32), ("threads", _i32), ("scale", _f32),
                ("write_index", _ptr), ("cos", _ptr * STEP_TABLES), ("sin", _ptr * STEP_TABLES),
                *((name, _ptr * STEP_WINDOWS) for name in ("att_rows", "att_kv_len", "att_base", "att_first", "att_index")),
                ("normed", _ptr), ("qkv", _ptr), ("attended", _ptr), ("h", _ptr), ("gate_up", _ptr), ("act", _ptr)]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    if lib.sd_decode_rows.argtypes is None:
        lib.sd_decode_rows.argtypes = [ctypes.POINTER(_Layer), _i32, ctypes.POINTER(_Step)]
        lib.sd_decode_rows.restype = ctypes.c_int
    return lib


class RowLayers:
    """The C descriptors of a ``NativeDecoder``'s layers, made once; ``run`` is one forward."""

    def __init__(self, layers: Sequence[torch.nn.Module], spec: DecoderSpec) -> None:
        """``layers``: the decoder's prepared layers (``native_decoder.DecoderLayer``: block
        linears ``qkv``, ``o``, ``gate_up``, ``down`` and RMS norms ``norms``), one per ``spec.layers``."""
        self.spec, self.hidden = spec, spec.final_norm.weight.numel()
        self.tables = sorted({layer.rope for layer in spec.layers})
        self.windows = sorted({layer.window for layer in spec.layers}, key=lambda w: -1 if w is None else w)
        if len(self.tables) > STEP_TABLES or len(self.windows) > STEP_WINDOWS:
            raise ValueError("more rotary tables or sliding windows than the C step takes")
        self.layers = (_Layer * len(layers))()
        self.keep: list[torch.Tensor] = []  # the norm weights the descriptors point into (the linears keep theirs)
        for desc, layer, layer_spec in zip(self.layers, layers, spec.layers):
            for name in LINEARS:
                setattr(desc, name, getattr(layer, name).desc)  # a copy of the GGUFLinear's own descriptor
            norms = cast(torch.nn.ModuleDict, layer.norms)
            for name, norm in norms.items():
                setattr(desc, name, self._norm(cast(torch.Tensor, norm.weight), float(cast(float, norm.eps))))
            desc.table, desc.window = self.tables.index(layer_spec.rope), self.windows.index(layer_spec.window)
        self.widths = {name: max(getattr(layer, name).out_features for layer in layers) for name in ("qkv", "gate_up")}
        self.scale = spec.attn_scale if spec.attn_scale is not None else spec.head_dim ** -0.5
        self.lib = _bind(c_library.library())

    @classmethod
    def of(cls, layers: Sequence[torch.nn.Module], spec: DecoderSpec, row_kernels: bool) -> RowLayers | None:
        """The one-call stack, where the C row kernels run and every linear is a block linear
        (None: the per-op path runs every forward)."""
        linears = [getattr(layer, name) for layer in layers for name in LINEARS]
        if not row_kernels or not all(isinstance(lin, GGUFLinear) for lin in linears):
            return None
        if any(("q" in layer.norms) != ("k" in layer.norms) for layer in spec.layers):
            return None  # the C layer norms query and key heads together
        return cls(layers, spec)

    def _norm(self, weight: torch.Tensor, eps: float) -> _Norm:
        weight = weight.float().contiguous()
        self.keep.append(weight)
        return _Norm(weight.data_ptr(), eps)

    def run(self, x: torch.Tensor, write_index: torch.Tensor, rows: dict[int | None, RowAttention],
            rope: dict[str, tuple[torch.Tensor, torch.Tensor]], cache: PagedKVCache) -> torch.Tensor:
        """The last layer's hidden states of every row, ``x`` the scaled embeddings ``[T, hidden]``;
        ``rows``: the forward's one-row segments by sliding window (``self.windows``), covering
        every row; ``rope``: each table's cos/sin rows of the rows' positions. Writes the rows'
        keys and values into ``cache``."""
        spec = self.spec
        x = x.float().contiguous()
        tokens = x.shape[0]
        if (any(r.rows.numel() != tokens for r in rows.values()) or len(cache.keys) < len(self.layers)
                or cache.keys[0].dtype != torch.float32 or write_index.dtype != torch.int64):
            raise ValueError("the C decoder stack takes forwards of one-row segments over a float32 cache of "
                             "every layer")
        for desc, keys, values in zip(self.layers, cache.keys, cache.values):
            desc.keys, desc.values, desc.head_stride = keys.data_ptr(), values.data_ptr(), keys.stride(0)
        scratch = [x.new_empty(tokens, width) for width in (
            self.hidden, self.widths["qkv"], spec.heads * spec.head_dim, self.hidden, self.widths["gate_up"],
            self.widths["gate_up"] // 2)]  # normed, qkv, attended, h, gate_up, act
        layouts = [rows[window].pointers for window in self.windows]
        tables = [rope[name] for name in self.tables]
        write_index = write_index.contiguous()
        step = _Step(x.data_ptr(), tokens, self.hidden, spec.heads, spec.kv_heads, spec.head_dim,
                     row_kernels.ACTIVATIONS.index(spec.activation), int(spec.sandwich), torch.get_num_threads(),
                     self.scale, write_index.data_ptr(),
                     (_ptr * STEP_TABLES)(*(cos.data_ptr() for cos, _ in tables)),
                     (_ptr * STEP_TABLES)(*(sin.data_ptr() for _, sin in tables)),
                     *((_ptr * STEP_WINDOWS)(*(layout[i] for layout in layouts)) for i in range(5)),
                     *(t.data_ptr() for t in scratch))
        rc = self.lib.sd_decode_rows(self.layers, len(self.layers), ctypes.byref(step))
        if rc != 0:
            raise ValueError(f"the C decoder stack refused this step (rc {rc})")
        return x
