"""The GGUF block kernels (``specdec_core/kernels/csrc``, ``gguf_linear``) against the ``gguf`` package.

1. the product equals, within float32 accumulation rounding, the exact (float64) product of the
   ``gguf`` package's own dequantization of the blocks and the activations quantized per row to
   8 bits (one scale per 32 values), or to 16 bits for Q8_0 made at load;
2. a row's result is bit-identical (``torch.equal``) alone, in 5 or 16 rows, on 1 or 2 threads;
3. the fused layer (mixed formats, one output) equals its parts, and a row subset its rows;
4. ``--quantize gguf`` on a float weight makes ggml's own Q8_0 blocks at load, multiplied with
   16-bit activations (per-row int8 where a row is not a multiple of 32).

Every format runs on every kernel set the CPU has (AMX-INT8, AVX-512 VNNI, AVX2, the portable
C), and the vector sets give every output the same bits (5).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specdec_core.execution.gguf_linear import BlockWeight, GGUFLinear
from specdec_core.execution.linear_kernels import RowInt8Linear, prepare_linear
from specdec_core.execution.q8_0_blocks import quantize_q8_0
from specdec_core.kernels import c_library
from tests.helpers.gguf_blocks import blocks_for, use_kernel_set

T = GGMLQuantizationType
FORMATS = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
# (format, activation bits): every file format with 8-bit activations, and Q8_0 made at load with 16
KERNELS = [(t, 8) for t in FORMATS] + [(T.Q8_0, 16)]
KERNEL_IDS = [f"{t.name}x{bits}" for t, bits in KERNELS]
IMPLS = list(c_library.KERNEL_SETS)  # every set, each bit for bit against the dequantized product
VECTOR_SETS = [s for s in IMPLS if s != "portable"]  # the sets that repack (one layout for all of them)
REPACKED = [(t, 8) for t in (T.Q4_K, T.Q6_K, T.Q4_0, T.Q5_0, T.Q8_0)] + [(T.Q8_0, 16)]


@pytest.fixture(autouse=True, scope="module")
def _kernels():
    c_library.library()
    yield
    c_library.select_kernels("auto")


def quantize_rows(x: np.ndarray, block: int, bits: int = 8) -> np.ndarray:
    """The activations as the kernel sees them: per row and block of ``block`` values, scale
    max|x| / 127 (8 bits) or / 32767 (16), values rounded half to even; returned dequantized, in float64."""
    qmax = np.float32(2 ** (bits - 1) - 1)
    v = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(v).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, qmax / np.where(amax > 0, amax, 1), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(v * inv), -qmax, qmax)
    return (q.astype(np.float64) * (amax / qmax).astype(np.float64)).reshape(x.shape)


def activations(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    x[1 % rows] *= 40.0  # an outlier row: must not change the others
    if rows > 2:
        x[2] = 0.0  # an all-zero row (scale 0)
    return x


def run(qtype: GGMLQuantizationType, blocks: np.ndarray, x: torch.Tensor, threads: int = 2, bits: int = 8) -> torch.Tensor:
    out = torch.empty(x.shape[0], blocks.shape[0])
    code = int(qtype) | (c_library.ACT16 if bits == 16 else 0)
    c_library.gemm(code, torch.from_numpy(np.ascontiguousarray(blocks)), x, out, threads)
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("qtype, bits", KERNELS, ids=KERNEL_IDS)
def test_kernel_equals_dequantized_product(qtype, bits, impl):
    use_kernel_set(impl)
    n, k = 40, 768
    blocks = blocks_for(qtype, n, k, seed=int(qtype))
    x = activations(6, k, seed=1)
    weight = quants.dequantize(blocks, qtype).astype(np.float64)
    want = quantize_rows(x.numpy(), 32, bits) @ weight.T
    got = run(qtype, blocks, x, bits=bits).double().numpy()
    # float32 accumulation of exact integer block sums: relative to the row's sum of |terms|
    scale = np.abs(quantize_rows(x.numpy(), 32, bits)) @ np.abs(weight).T
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), np.abs(got - want).max()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("qtype, bits", KERNELS, ids=KERNEL_IDS)
def test_rows_bit_identical_alone_and_batched(qtype, bits, impl):
    use_kernel_set(impl)
    n, k = 37, 512
    blocks = blocks_for(qtype, n, k, seed=7)
    x = activations(16, k, seed=2)
    full = run(qtype, blocks, x, bits=bits)
    assert torch.equal(run(qtype, blocks, x, threads=1, bits=bits), full)
    for m in (1, 5):
        for start in range(0, 16 - m + 1, 3):
            assert torch.equal(run(qtype, blocks, x[start:start + m], bits=bits), full[start:start + m]), (m, start)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("qtype, bits", KERNELS, ids=KERNEL_IDS)
def test_every_row_count_gives_each_row_the_bits_it_gets_alone(qtype, bits, impl):
    """The layer as the runner builds it (repacked where the active kernels repack): each row of
    an M-row call, M in 1..17 (tiles of several rows plus a remainder), equals that row alone,
    on 1 and 2 threads; 37 outputs leave a partial last group of 8 columns."""
    use_kernel_set(impl)
    n, k = 37, 512
    layer = GGUFLinear([BlockWeight(int(qtype), torch.from_numpy(blocks_for(qtype, n, k, seed=11)), k, bits)], None)
    x = activations(17, k, seed=12)
    alone = torch.cat([layer(x[r:r + 1]) for r in range(17)])
    for m in (2, 3, 5, 8, 16, 17):
        for start in sorted({0, 17 - m}):
            assert torch.equal(layer(x[start:start + m]), alone[start:start + m]), (m, start)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(layer(x), alone)
    finally:
        torch.set_num_threads(threads)


def test_torchs_openmp_team_and_our_own_pool_compute_the_same_bits():
    """The kernels run on the OpenMP team torch uses (found among the loaded libraries: torch
    loads one here), or on a pool of ours; with 1-3 threads and either pool, every output is the
    same bits (each part computes the same outputs with the same code)."""
    assert c_library.thread_pool() == "openmp"
    n, k = 45, 512
    blocks = torch.from_numpy(blocks_for(T.Q4_K, n, k, seed=5))
    x = activations(7, k, seed=6)
    reference = torch.empty(7, n)
    c_library.gemm(int(T.Q4_K), blocks, x, reference, threads=1)
    try:
        for own in (False, True):
            assert c_library.thread_pool(own=own) == ("own" if own else "openmp")
            for threads in (2, 3):
                out = torch.empty(7, n)
                c_library.gemm(int(T.Q4_K), blocks, x, out, threads=threads)
                assert torch.equal(out, reference), (own, threads)
    finally:
        c_library.thread_pool(own=False)


def run_repacked(qtype: GGMLQuantizationType, blocks: np.ndarray, x: torch.Tensor, threads: int = 2, bits: int = 8
                 ) -> torch.Tensor:
    kind = int(qtype) | (c_library.ACT16 if bits == 16 else 0)
    packed = c_library.repack(kind, torch.from_numpy(np.ascontiguousarray(blocks)), x.shape[1])
    assert packed is not None
    out = torch.empty(x.shape[0], blocks.shape[0])
    c_library.gemm(packed[0], packed[1], x, out, threads)
    return out


@pytest.mark.parametrize("impl", VECTOR_SETS)
@pytest.mark.parametrize("qtype, bits", REPACKED, ids=[f"{t.name}x{bits}" for t, bits in REPACKED])
def test_repacked_equals_dequantized_product_and_is_row_invariant(qtype, bits, impl):
    """Formats repacked 8 output rows at a time (the vector sets; Q8_0 also with 16-bit
    activations): same checks as the file's layout, with a last group of 5 rows (37 = 4 x 8 + 5),
    and tiles of 5, 6 or 8 rows plus a remainder."""
    use_kernel_set(impl)
    n, k = 37, 768
    blocks = blocks_for(qtype, n, k, seed=9)
    x = activations(16, k, seed=4)
    weight = quants.dequantize(blocks, qtype).astype(np.float64)
    xq = quantize_rows(x.numpy(), 32, bits)
    full = run_repacked(qtype, blocks, x, bits=bits)
    assert np.all(np.abs(full.double().numpy() - xq @ weight.T) <= 1e-5 * (np.abs(xq) @ np.abs(weight).T) + 1e-30)
    assert torch.equal(run_repacked(qtype, blocks, x, threads=1, bits=bits), full)
    for m in (1, 3, 5, 7, 9):
        for start in range(0, 16 - m + 1, 3):
            assert torch.equal(run_repacked(qtype, blocks, x[start:start + m], bits=bits), full[start:start + m]), (m, start)
    threads = torch.get_num_threads()  # the repacking splits its groups of 8 rows over threads
    try:
        torch.set_num_threads(1)
        alone = c_library.repack(int(qtype), torch.from_numpy(blocks), k)
    finally:
        torch.set_num_threads(threads)
    torch.set_num_threads(2)
    try:
        assert torch.equal(c_library.repack(int(qtype), torch.from_numpy(blocks), k)[1], alone[1])
    finally:
        torch.set_num_threads(threads)
    c_library.select_kernels("portable")  # a repacked weight is refused by the portable kernels
    with pytest.raises(ValueError):
        c_library.gemm(int(T.Q4_K) | 0x100, torch.zeros(1184, dtype=torch.uint8), x[:1], torch.empty(1, 8))
    assert c_library.repack(int(qtype), torch.from_numpy(blocks), k) is None
    c_library.select_kernels("auto")


@pytest.mark.parametrize("qtype, bits", KERNELS, ids=KERNEL_IDS)
def test_the_vector_sets_give_every_output_the_same_bits(qtype, bits):
    """AVX-512 VNNI sums the same exact integers as AVX2 (one vpdpbusd where AVX2 takes
    vpmaddubsw, an int16 add and vpmaddwd) and shares every float step (gguf_x8_tiles.h); the AMX
    set's 512-bit tiles (two 8-column groups a register, up to 10 rows) are the same template, and
    its tile products (csrc/gguf_amx.c, from 11 rows, 16 a tile) sum the same integers and apply
    the same float steps. So a layer prepared once gives the same bits on every set, for 1..33
    rows, on 1 and 2 threads (a lone group; the last group of 5 columns paired with the one before it)."""
    sets = [name for name in c_library.runnable_kernels() if name != "portable"]
    if len(sets) < 2:
        pytest.skip(f"this CPU runs one vector set (it has: {' '.join(c_library.cpu_features())})")
    n, k, counts = 45, 768, (1, 2, 3, 5, 7, 8, 9, 16, 17, 33)
    layer = GGUFLinear([BlockWeight(int(qtype), torch.from_numpy(blocks_for(qtype, n, k, seed=21)), k, bits)], None)
    x = activations(max(counts), k, seed=22)
    threads = torch.get_num_threads()
    outputs = {}
    try:
        for name in sets:
            c_library.select_kernels(name)
            for t in (1, 2):
                torch.set_num_threads(t)
                outputs[name, t] = [layer(x[:m]) for m in counts]
    finally:
        torch.set_num_threads(threads)
        c_library.select_kernels("auto")
    for (name, t), got in outputs.items():
        for m, a, b in zip(counts, outputs[sets[-1], 2], got, strict=True):
            assert torch.equal(a, b), (name, t, m, (a != b).nonzero()[:5].tolist())


@pytest.mark.parametrize("k_quant", [True, False], ids=["act_k", "act_32"])
def test_avx2_and_portable_activation_quantizers_make_the_same_bytes(k_quant):
    """Every GEMM quantizes its rows first; the AVX2 quantizer must be the portable one, bit for
    bit, also on the edges: ties at .5, all-zero blocks, an outlier, NaN and inf, subnormal and
    near-overflow scales."""
    if c_library.select_kernels("auto") == "portable":
        pytest.skip("no AVX2 quantizer on this CPU")  # every vector set quantizes with it
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 1024, generator=gen) * torch.logspace(-38, 38, 9).unsqueeze(1).clamp(max=3e38)
    x[2] = 0.0
    x[3, :64] = (torch.arange(64) - 32) * 0.5  # halves: rounding ties, both signs
    x[4, 7] = 1e4  # an outlier squeezes its block's other values towards 0
    x[5, [40, 63, 92, 127]] = float("nan")  # also in a block's last 8, where a max with its operands swapped keeps NaN
    x[5, 300] = float("inf")
    x[6, 500] = -float("inf")
    x[7] = torch.randn(1024, generator=gen) * 1e-42  # subnormal
    portable = (c_library.select_kernels("portable"), c_library.quantize_activations(x, k_quant))[1]
    native = (c_library.select_kernels("auto"), c_library.quantize_activations(x, k_quant))[1]
    assert torch.equal(native, portable), (native != portable).nonzero()[:5].tolist()


def test_fused_mixed_formats_equal_parts_and_row_subset():
    c_library.select_kernels("auto")
    k = 512
    q = BlockWeight(int(T.Q4_K), torch.from_numpy(blocks_for(T.Q4_K, 24, k, 3)), k)
    kk = BlockWeight(int(T.Q4_K), torch.from_numpy(blocks_for(T.Q4_K, 8, k, 4)), k)
    v = BlockWeight(int(T.Q6_K), torch.from_numpy(blocks_for(T.Q6_K, 8, k, 5)), k)
    bias = torch.randn(40)
    fused = GGUFLinear([q, kk, v], bias)
    assert fused.formats == ["Q4_K", "Q6_K"]  # same-format neighbours merged
    x = activations(5, k, seed=6).reshape(1, 5, k)
    got = fused(x)
    assert got.shape == (1, 5, 40)
    parts = [GGUFLinear([w], None)(x) for w in (q, kk, v)]
    assert torch.equal(got, torch.cat(parts, dim=-1) + bias)
    rows = [3, 30, 0, 17]
    sub = GGUFLinear([q.rows(rows[:1] + rows[2:]), v.rows([0])], None)(x)
    assert torch.equal(sub[..., 0], parts[0][..., 3]) and torch.equal(sub[..., 3], parts[2][..., 0])


def test_float_weights_get_ggmls_q8_0_blocks_at_load():
    gen = torch.Generator().manual_seed(8)
    weight = torch.randn(300, 320, generator=gen)  # 300 rows: the quantizer's row chunks do not divide it
    weight[5, 32:64] = 0.0  # an all-zero block (scale 0)
    weight[7, :32] = torch.arange(32) * 0.5 - 8  # ties: ggml rounds half away from zero
    blocks = quantize_q8_0(weight)
    assert blocks.ggml_type == int(T.Q8_0)
    assert np.array_equal(blocks.blocks.numpy(), quants.quantize(weight.numpy(), T.Q8_0))
    bias = torch.randn(300, generator=gen)
    layer = prepare_linear(weight, bias, "gguf")
    assert isinstance(layer, GGUFLinear) and layer.formats == ["Q8_0 (16-bit act)"]
    x = activations(5, 320, seed=9)
    with16 = BlockWeight(blocks.ggml_type, blocks.blocks, blocks.in_features, activation_bits=16)
    assert torch.equal(layer(x), GGUFLinear([with16], bias)(x))
    assert not torch.equal(layer(x), GGUFLinear([blocks], bias)(x))  # not the file blocks' 8-bit activations
    assert all(torch.equal(layer(x[i:i + 1]), layer(x)[i:i + 1]) for i in range(5))
    assert isinstance(prepare_linear(torch.randn(8, 48), None, "gguf"), RowInt8Linear)  # 48: no Q8_0 row


def test_unsupported_format_or_length_refused():
    k = 96  # not a multiple of 256: no K-quant row of this length exists
    with pytest.raises(ValueError):
        GGUFLinear([BlockWeight(int(T.Q4_K), torch.zeros(4, 54, dtype=torch.uint8), k)], None)
    with pytest.raises(ValueError):
        GGUFLinear([BlockWeight(int(T.Q2_K), torch.zeros(4, 84, dtype=torch.uint8), 256)], None)
    with pytest.raises(ValueError):  # 16-bit activations: Q8_0 only, in the kernels as here
        GGUFLinear([BlockWeight(int(T.Q4_0), torch.zeros(4, 18, dtype=torch.uint8), 32, activation_bits=16)], None)
    out = torch.empty(1, 4)
    with pytest.raises(ValueError):
        c_library.gemm(int(T.Q4_0) | c_library.ACT16, torch.zeros(4, 18, dtype=torch.uint8), torch.ones(1, 32), out)


def test_the_extension_built_at_install_is_the_sources_the_module_would_compile():
    """setup.py and ``c_library`` read one build definition (``kernels/build_definition``): a
    library built at install from other files or in another order would report another hash,
    and every start would compile the kernels afresh into the cache instead of loading it."""
    installed = c_library._installed_extension()
    if installed is None:
        pytest.skip("the optional extension was not built at install (no C compiler then)")
    assert c_library._built_from(ctypes.CDLL(str(installed))) == c_library.sources_hash()
