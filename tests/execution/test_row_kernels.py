"""The C row kernels (``csrc/row_ops.c``, ``csrc/row_attention.c``) against the torch forms
they replace on the CPU: equal up to rounding (bit for bit where the arithmetic is the same),
and every row bit-identical whether computed alone or beside other rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec_core.execution import row_kernels
from specdec_core.execution.attention import RowAttention, Segment, attend_rows, attend_segments, split_single_rows
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.native_decoder import _rope
from specdec_core.kernels import c_library
from tests.helpers.gguf_blocks import use_kernel_set
from tests.helpers.models import load
from tests.helpers.runners import slot_runner

pytestmark = pytest.mark.skipif(not DeviceProfile.decide("cpu", "float32", "none").row_kernels,
                                reason="the row kernels run where the C kernels are built with AVX2")


@pytest.fixture(params=c_library.KERNEL_SETS)
def impl(request):
    """Every kernel set this CPU runs: the portable one is what a CPU without AVX2 would run."""
    use_kernel_set(request.param)
    yield request.param
    c_library.select_kernels("auto")


def test_rms_norm_matches_torch_and_rows_do_not_depend_on_the_batch(impl):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1536, generator=g) * 3
    w = torch.randn(1536, generator=g)
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    got = row_kernels.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for r in (0, 17, 39):  # 40 rows run on the thread team, one row on the caller
        assert torch.equal(row_kernels.rms_norm(x[r:r + 1], w, 1e-6)[0], got[r])


def test_rope_computes_exactly_the_torch_form(impl):
    g = torch.Generator().manual_seed(1)
    tokens, heads, kv_heads, d = 7, 6, 2, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g)
    cos, sin = torch.randn(tokens, d, generator=g), torch.randn(tokens, d, generator=g)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    ref_q, ref_k = _rope(q.reshape(tokens, heads, d), cos, sin), _rope(k.reshape(tokens, kv_heads, d), cos, sin)
    ref_v = v.clone()
    row_kernels.rope_(qkv, heads + kv_heads, d, cos, sin)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    assert torch.equal(q.reshape(tokens, heads, d), ref_q)
    assert torch.equal(k.reshape(tokens, kv_heads, d), ref_k)
    assert torch.equal(v, ref_v)  # the values are not rotated


@pytest.mark.parametrize("activation", row_kernels.ACTIVATIONS)
def test_gate_mul_matches_torch(impl, activation):
    g = torch.Generator().manual_seed(2)
    gate_up = torch.randn(20, 2 * 1000, generator=g) * 8  # exp over a wide range, 1000 not a multiple of 8
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
    got = row_kernels.gate_mul(gate_up, activation)
    torch.testing.assert_close(got, act * up, rtol=1e-5, atol=1e-5)
    assert torch.equal(row_kernels.gate_mul(gate_up[3:4], activation)[0], got[3])


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(12, 2, 128), (14, 2, 64), (4, 4, 16), (9, 3, 64), (24, 2, 32)])
def test_row_attention_matches_sdpa(impl, heads, kv_heads, head_dim):
    """Over tile boundaries (64 keys), GQA groups of 1 to 12 (over the 8 heads of one pass), gathered
    and contiguous keys."""
    g = torch.Generator().manual_seed(heads * head_dim)
    cache_rows = 600
    keys, values = torch.randn(kv_heads, cache_rows, head_dim, generator=g), torch.randn(kv_heads, cache_rows, head_dim, generator=g)
    gather = torch.randperm(cache_rows, generator=g)[:300]
    lengths = [1, 7, 63, 64, 65, 129, 300]
    segments = [Segment(i, 1, 11 * i, n, None) for i, n in enumerate(lengths)]
    segments += [Segment(len(lengths) + i, 1, 0, n, None, gather, 0) for i, n in enumerate(lengths)]
    q = (torch.randn(len(segments), heads, head_dim, generator=g) * 2).transpose(0, 1)
    ref = attend_segments(q, keys, values, segments)  # torch SDPA, one call per segment
    multi, rows = split_single_rows(segments)
    assert multi == [] and rows is not None
    got = attend_segments(q, keys, values, multi, rows)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-6)
    # gathered keys give the bits the same keys give in one run
    contiguous_keys = keys.clone()
    contiguous_values = values.clone()
    contiguous_keys[:, 0:300], contiguous_values[:, 0:300] = keys[:, gather], values[:, gather]
    same = [Segment(i, 1, 0, n, None) for i, n in enumerate(lengths)]
    _, run = split_single_rows(same)
    from_run = attend_segments(q[:, len(lengths):], contiguous_keys, contiguous_values, [], run)
    assert torch.equal(from_run, got[len(lengths):])
    # a row alone is the row batched
    for i in (0, 4, len(segments) - 1):
        _, alone = split_single_rows([Segment(0, 1, segments[i].base, segments[i].kv_len, None, segments[i].gather, 0)])
        assert torch.equal(attend_segments(q[:, i:i + 1], keys, values, [], alone)[0], got[i])


def _request_rows(g: torch.Generator, heads: int, kv_heads: int, head_dim: int):
    """Rows of several requests the way a forward lays them out, and some interleaved: a prompt
    chunk over tile boundaries (contiguous keys), a request's 5 drafts and a token tree's nodes
    (uneven lengths over one gathered list), single decode rows, two requests' rows alternating,
    equal lengths in a group; a query head and some keys of zeros (scores of +0 and -0)."""
    cache_rows = 700
    keys = torch.randn(kv_heads, cache_rows, head_dim, generator=g)
    values = torch.randn(kv_heads, cache_rows, head_dim, generator=g)
    keys[:, 40:45] = 0.0
    gathers = [torch.randperm(cache_rows, generator=g)[:n] for n in (300, 200)]
    first = {0: 0, 1: 300}
    rows: list[tuple[int, int, int]] = []  # (kv_len, base, first)
    rows += [(n, 7, -1) for n in range(100, 171)]  # prompt chunk at context 99
    rows += [(n, 0, first[0]) for n in range(60, 65)]  # drafts to verify
    rows += [(n, 0, first[1]) for n in (10, 12, 11, 12, 13, 64, 65, 63, 129, 128, 200)]  # tree nodes
    rows += [(1, 400, -1), (257, 0, first[0]), (300, 0, first[0]), (77, 500, -1)]  # decode rows
    rows += [x for n in range(63, 70) for x in ((n, 7, -1), (n + 100, 0, first[1]))]  # interleaved
    rows += [(45, 0, -1)] * 4 + [(44, 0, -1), (3, 0, -1)]  # equal lengths, the zero keys last
    kv_len, base, first_ = (torch.tensor(c, dtype=torch.int64) for c in zip(*rows))
    q_rows = torch.randperm(len(rows) + 5, generator=g)[:len(rows)]
    q = torch.randn(len(rows) + 5, heads, head_dim, generator=g) * 3
    q[:, 1] = 0.0
    index = torch.cat(gathers)
    return q.transpose(0, 1), keys, values, RowAttention(q_rows, kv_len, base, first_, index)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(12, 2, 128), (14, 2, 64), (8, 8, 64), (16, 4, 128),
                                                     (24, 2, 32), (8, 1, 256), (16, 2, 96), (4, 4, 16)])
@pytest.mark.parametrize("threads", [1, 2])
def test_row_attention_rows_of_one_request_get_the_bits_of_one_row_alone(impl, heads, kv_heads, head_dim, threads):
    """The kernel reads a tile of keys once for a group of one request's rows (each up to its own
    length): every row must still get exactly the bits one call for that row alone gives."""
    g = torch.Generator().manual_seed(heads * head_dim + kv_heads)
    q, keys, values, rows = _request_rows(g, heads, kv_heads, head_dim)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.zeros(q.shape[1], heads, head_dim)
        attend_rows(q, keys, values, rows, out)
        alone = torch.zeros_like(out)
        for i in range(rows.rows.numel()):
            one = RowAttention(*(t[i:i + 1].clone() for t in (rows.rows, rows.kv_len, rows.base, rows.first)),
                               rows.index)
            attend_rows(q, keys, values, one, alone)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out, alone)
    assert torch.isfinite(out[rows.rows]).all()


def test_row_attention_vector_sets_agree_bit_for_bit():
    """The AVX-512 path computes each key's two 8-lane halves in one register: the same bits as
    the AVX2 path, so a host's kernel set does not change a row's logits."""
    sets = [s for s in c_library.runnable_kernels() if s != "portable"]
    if len(sets) < 2:
        pytest.skip(f"this CPU runs one vector kernel set ({sets})")
    results = []
    try:
        for name in sets:
            c_library.select_kernels(name)
            got = []
            for heads, kv_heads, head_dim in [(12, 2, 128), (14, 2, 64), (24, 2, 32), (16, 2, 96)]:
                q, keys, values, rows = _request_rows(torch.Generator().manual_seed(heads + head_dim), heads, kv_heads,
                                                      head_dim)
                out = torch.zeros(q.shape[1], heads, head_dim)
                attend_rows(q, keys, values, rows, out)
                got.append(out)
            results.append(got)
    finally:
        c_library.select_kernels("auto")
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_cpu_float32_runner_uses_the_row_kernels(tiny_model_factory):
    """A CPU float32 runner runs every layer's row-wise ops and its one-row segments (decode rows,
    drafts) in C, and its prompt blocks through torch's attention."""
    loaded = load(tiny_model_factory("qwen2", num_layers=2, hidden=64, seed=5))
    run = slot_runner(loaded.model, 4, 64, vocab_size=loaded.model.get_output_embeddings().weight.shape[0])
    assert run.row_attention and all(layer.fused for layer in run.native.layers) and run.native.norm.fused
    segments = [Segment(0, 16, 0, 16, None), Segment(16, 1, 0, 17, None), Segment(17, 1, 0, 18, None)]
    multi, rows = split_single_rows(segments)
    assert [s.q_len for s in multi] == [16]
    assert rows is not None and rows.rows.tolist() == [16, 17] and rows.kv_len.tolist() == [17, 18]
