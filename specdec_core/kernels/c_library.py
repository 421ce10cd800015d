"""specdec's C library (``csrc/``), bound through ctypes: the kernels that multiply activations by
a GGUF file's own quantized blocks, and the row operations (RMS norm, RoPE, gated products),
row attention and one-call decoder stack that run beside them on a CPU (``execution/row_kernels``,
``attention``, ``row_layers``).

Why our own block kernels: torch has no fast low-bit CPU kernel on AVX2 (``_weight_int4pack_mm_for_cpu`` is
compute-bound at ~7 GB/s on the AVX2 development machine, a fifth of its memory bandwidth),
and the GGUF blocks are what the user
downloaded. The kernel quantizes each activation row to 8 bits on its own, one scale per 32
values (like ggml's Q8_0; ggml gives the K-quants one scale per 256 values, Q8_K, which on
Qwen2.5-1.5B's outlier channels costs KL 0.15 nats against fp32 where per-32 costs 0.003: an
emulation on the dequantized weights, three prompts), so a row's result never depends on the
other rows of the call. Q8_0 blocks made at load from a float weight (``q8_0_blocks``) are
multiplied with activations quantized to 16 bits instead (``ACT16``): 8-bit activations were
most of what those blocks lost against fp32.

The library is built at install (``setup.py``, an optional extension: an install without a C
compiler still succeeds) or, failing that, compiled on first use with ``cc`` into the cache
directory; both builds read ``build_definition``. ``available()`` says whether either worked;
``library()`` raises a ``RuntimeError`` that names what is missing otherwise.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from specdec_core.kernels.build_definition import CSRC, EXTENSION, compile_command, sources_hash

# GGML type ids (``gguf.GGMLQuantizationType``) the kernels execute.
SUPPORTED_TYPES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
# A type code with this flag (SD_ACT16) multiplies the weight with activations quantized to 16 bits
# per 32 values instead of 8 (``csrc/gguf_q8_0_act16.c``), for these types.
ACT16 = 0x200
ACT16_TYPES = (8,)

# The kernel sets, best first. ``SPECDEC_KERNELS`` picks one for the process (tests, A/B runs, a host
# where a path misbehaves); ``auto``, the default, takes the best this CPU and OS support.
KERNEL_SETS = ("amx-int8", "avx512-vnni", "avx2", "portable")
# Each set's number in the C library (SD_IMPL_*, csrc/gguf_kernels.h); 0 asks for the best this CPU
# runs. Also read by clients/tools/gguf_kernel_ab.py, which binds builds of its own.
KERNEL_SET_CODES = {"portable": 1, "avx2": 2, "avx512-vnni": 3, "amx-int8": 4}
KERNELS_ENV = "SPECDEC_KERNELS"
# A build of these sources to load instead of the installed one: how the tests run the AMX set's
# emulation build (``build_definition.AMX_EMULATION``) on a CPU without AMX.
LIBRARY_ENV = "SPECDEC_C_LIBRARY"
# sd_cpu_features() bits (csrc/gguf_kernels.h): reported at start-up whether or not a kernel set uses them yet
_CPU_FEATURES = {1: "avx2", 2: "avx512", 4: "avx512-vnni", 8: "amx-int8"}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.sd_gguf_gemm.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, i64, ptr, i64, ctypes.c_int]
    lib.sd_gguf_gemm.restype = ctypes.c_int
    lib.sd_gguf_row_bytes.argtypes = [ctypes.c_int, i64]
    lib.sd_gguf_row_bytes.restype = i64
    lib.sd_gguf_set_impl.argtypes = [ctypes.c_int]
    lib.sd_gguf_set_impl.restype = ctypes.c_int
    lib.sd_cpu_features.argtypes = []
    lib.sd_cpu_features.restype = ctypes.c_int
    lib.sd_kernel_impl.argtypes = []
    lib.sd_kernel_impl.restype = ctypes.c_int
    lib.sd_gguf_x8_type.argtypes = [ctypes.c_int]
    lib.sd_gguf_x8_type.restype = ctypes.c_int
    lib.sd_gguf_x8_size.argtypes = [ctypes.c_int, i64, i64]
    lib.sd_gguf_x8_size.restype = i64
    lib.sd_gguf_x8_repack.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, ctypes.c_int]
    lib.sd_gguf_x8_repack.restype = ctypes.c_int
    lib.sd_act_row_bytes.argtypes = [ctypes.c_int, i64]
    lib.sd_act_row_bytes.restype = i64
    lib.sd_quantize_rows.argtypes = [ctypes.c_int, ptr, i64, i64, i64, ptr, i64]
    lib.sd_quantize_rows.restype = None
    lib.sd_gguf_thread_pool.argtypes = []
    lib.sd_gguf_thread_pool.restype = ctypes.c_int
    lib.sd_gguf_set_pool.argtypes = [ctypes.c_int]
    lib.sd_gguf_set_pool.restype = ctypes.c_int
    lib.sd_attend_rows.argtypes = [ptr, i64, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr, i64, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_float, ptr, i64, ctypes.c_int]
    lib.sd_attend_rows.restype = ctypes.c_int
    f32, i32 = ctypes.c_float, ctypes.c_int
    lib.sd_rms_norm.argtypes = [ptr, i64, i64, i64, ptr, f32, ptr, i64, i32]
    lib.sd_rms_norm.restype = None
    lib.sd_rope.argtypes = [ptr, i64, i64, i32, i32, ptr, ptr, i64]
    lib.sd_rope.restype = None
    lib.sd_gate_mul.argtypes = [ptr, i64, i64, i64, ptr, i64, i32, i32]
    lib.sd_gate_mul.restype = None
    lib.sd_block_linear.argtypes = [ptr, ptr, i64, i64, ptr, ctypes.c_int]
    lib.sd_block_linear.restype = ctypes.c_int
    return lib


def _built_from(lib: ctypes.CDLL) -> str:
    """The source hash compiled into ``lib`` ("" for a library older than the hash itself)."""
    try:
        fn = lib.sd_gguf_sources_hash
    except AttributeError:
        return ""
    fn.restype = ctypes.c_char_p
    return fn().decode()


def _installed_extension() -> Path | None:
    """The shared library ``setup.py`` built at install, if it did."""
    try:
        spec = importlib.util.find_spec(EXTENSION)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _compile_into_cache() -> Path:
    """Compile the sources with the system C compiler into the cache, keyed by their content."""
    from specdec_core.kernels.cache_paths import default_cache_dir

    digest = sources_hash()
    out_dir = default_cache_dir() / "kernels"
    target = out_dir / f"libgguf_kernels-{digest}.so"
    if target.is_file():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("the GGUF block kernels were not built at install and no C compiler (cc/gcc) is on PATH; "
                           "install gcc and reinstall specdec, or use --quantize int8")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        partial = Path(tmp) / target.name
        cmd = compile_command(compiler, partial, digest)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"compiling the GGUF block kernels failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
        os.replace(partial, target)
    return target


def _one_numpy_blas_thread() -> None:
    """numpy's OpenBLAS workers, once woken by numpy work (``gguf.quants`` at load, a file-served
    model's embedding lookups every step), compete for the cores the kernels' OpenMP team runs
    on: measured on the 2-core AMD EPYC dev machine, a call of a 1536x640 Q8_0 layer took 8 ms
    with them and 0.07 ms without, a Gemma 3 270M decode step 658 ms against 26 ms. specdec does
    no matrix work in numpy, so its BLAS gets one thread (``threadpoolctl``, rather than
    environment variables that only act before numpy is imported)."""
    import numpy  # noqa: F401 - loaded first, so that its BLAS is among the pools limited
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def library() -> ctypes.CDLL:
    """The loaded kernel library (``SPECDEC_C_LIBRARY``'s, else the one built at install, else
    compiled once into the cache)."""
    global _lib, _error
    with _lock:
        if _lib is None:
            if _error is not None:
                raise RuntimeError(_error)
            try:
                lib = None
                override = os.environ.get(LIBRARY_ENV)
                installed = None if override else _installed_extension()
                if override:
                    lib = ctypes.CDLL(override)
                elif installed is not None:
                    lib = ctypes.CDLL(str(installed))
                    if CSRC.is_dir() and _built_from(lib) != sources_hash():
                        lib = None  # built from older sources (an editable install): compile afresh
                lib = _bind(lib or ctypes.CDLL(str(_compile_into_cache())))
                _one_numpy_blas_thread()
            except (OSError, RuntimeError) as exc:
                _error = f"GGUF block kernels unavailable: {exc}"
                raise RuntimeError(_error) from exc
            _select(lib, os.environ.get(KERNELS_ENV) or "auto")  # a bad value raises ValueError, every time asked
            _lib = lib
        return _lib


def available() -> bool:
    """True when the kernels can run here (``library()`` would succeed)."""
    try:
        library()
    except RuntimeError:
        return False
    return True


def build() -> str:
    """The source hash the loaded library was compiled from: step costs timed with one build are
    not kept for another (``engine/startup_costs.py``)."""
    return _built_from(library())


def thread_pool(own: bool | None = None) -> str:
    """Whose threads run the kernels: ``"openmp"`` (the OpenMP team torch's own ops use, found
    among the loaded libraries) or ``"own"`` (a pool of ours, where no OpenMP runtime is loaded).
    ``own=True`` forces our pool, ``own=False`` goes back (tests and A/B measurements compare)."""
    lib = library()
    active = lib.sd_gguf_thread_pool() if own is None else lib.sd_gguf_set_pool(int(own))
    return "openmp" if active else "own"


def vectorized() -> bool:
    """True when the kernels can run here and the active set is a vector one (AVX2, AVX-512 VNNI, AMX;
    the portable C kernels are correct everywhere but not faster than int8, so ``--quantize auto``
    skips them)."""
    try:
        return bool(library().sd_gguf_x8_type(12))  # Q4_K is repacked by the vector sets only
    except RuntimeError:
        return False


def row_bytes(ggml_type: int, in_features: int) -> int:
    """Bytes of one weight row of ``in_features`` values; 0 when the kernels cannot run it."""
    return int(library().sd_gguf_row_bytes(ggml_type, in_features))


def cpu_features() -> list[str]:
    """What this CPU and its OS let kernels use (cpuid, the state the OS saves, AMX's permission),
    whether or not a kernel set uses it yet: logged at start-up, so a log says what a host could run."""
    return _names(library().sd_cpu_features())


def select_kernels(name: str) -> str:
    """Make ``name`` (one of ``KERNEL_SETS``, or ``auto``: the best this CPU runs) the kernel set of
    this process and return it; tests compare the sets. ``SPECDEC_KERNELS`` is applied the same
    way when the library loads. ValueError for a name that is not a set or that this CPU lacks."""
    return _select(library(), name)


def active_kernels() -> str:
    """The kernel set that runs: one of ``KERNEL_SETS``."""
    return _set_named(library().sd_kernel_impl())


def runnable_kernels() -> list[str]:
    """The kernel sets this CPU runs, best first (``portable`` always); tests run each of them."""
    return _runnable(library())


def _runnable(lib: ctypes.CDLL) -> list[str]:
    features = _names(lib.sd_cpu_features())
    if "avx512-vnni" not in features:  # the AMX set takes the VNNI tiles for what tiles do not pay for
        features = [f for f in features if f != "amx-int8"]
    return [k for k in KERNEL_SETS if k == "portable" or k in features]


def _select(lib: ctypes.CDLL, name: str) -> str:
    have = _runnable(lib)
    if name != "auto" and name not in KERNEL_SETS:
        features = set(_CPU_FEATURES.values())
        what = "specdec has no kernels for it yet" if name in features else "not a kernel set"
        raise ValueError(f"kernels {name!r} ({KERNELS_ENV}): {what}; this CPU runs: auto, {', '.join(have)}")
    if name != "auto" and name not in have:
        raise ValueError(f"kernels {name!r} ({KERNELS_ENV}): this CPU lacks them; it runs: auto, {', '.join(have)}")
    return _set_named(lib.sd_gguf_set_impl(KERNEL_SET_CODES.get(name, 0)))


def _set_named(code: int) -> str:
    return next(name for name, c in KERNEL_SET_CODES.items() if c == code)


def _names(bits: int) -> list[str]:
    return [name for bit, name in _CPU_FEATURES.items() if bits & bit]


def quantize_activations(x: torch.Tensor, k_quant: bool) -> torch.Tensor:
    """The bytes every GEMM makes of float32 rows ``x`` [M, K] before multiplying: per row, blocks
    of 8-bit values with one scale per 32 (the K-quants' blocks also carry exact sums), made by
    the active implementation. For tests: the AVX2 and portable quantizers must agree bit for bit."""
    lib = library()
    x = x.float().contiguous()
    m, k = x.shape
    stride = int(lib.sd_act_row_bytes(int(k_quant), k))
    out = torch.zeros(m, stride, dtype=torch.uint8)
    lib.sd_quantize_rows(int(k_quant), x.data_ptr(), k, m, k, out.data_ptr(), stride)
    return out


def repack(ggml_type: int, blocks: torch.Tensor, in_features: int) -> tuple[int, torch.Tensor] | None:
    """The layout the active kernels multiply fastest, when it is not the file's own: (the type
    code to pass to ``gemm``, the repacked bytes); None to use ``blocks`` as they are. The vector
    sets repack Q4_K, Q6_K, Q4_0, Q5_0 and Q8_0 8 output rows at a time, in one layout that either
    set multiplies (``csrc/gguf_x8*.c``; tiles in ``csrc/gguf_x8_tiles.h``); ``ggml_type`` may carry
    ``ACT16``, kept in the code (Q8_0's tiles for 16-bit activations: ``gguf_q8_0_act16_tile.h``)."""
    lib = library()
    code = lib.sd_gguf_x8_type(ggml_type)
    n = blocks.shape[0]
    size = lib.sd_gguf_x8_size(ggml_type, n, in_features) if code else 0
    if not size:
        return None
    blocks = blocks.contiguous()
    packed = torch.empty(size, dtype=torch.uint8)
    if lib.sd_gguf_x8_repack(ggml_type, blocks.data_ptr(), n, in_features, packed.data_ptr(), torch.get_num_threads()) != 0:
        return None
    return code, packed


def gemm(ggml_type: int, blocks: torch.Tensor, x: torch.Tensor, out: torch.Tensor, threads: int | None = None) -> None:
    """``out = x @ W.T`` for the ``N`` weight rows in ``blocks``: the file's layout (uint8
    ``[N, row_bytes]``) with the GGML type, or a ``repack`` (flat uint8) with the code ``repack``
    returned. ``x`` is float32 ``[M, K]``, ``out`` float32 ``[M, N]``, both with unit stride
    along their rows (``out`` may be a column slice of a wider output)."""
    m, k = x.shape
    n = out.shape[1] if blocks.dim() == 1 else blocks.shape[0]
    if x.dtype != torch.float32 or out.dtype != torch.float32 or blocks.dtype != torch.uint8:
        raise TypeError("gemm wants float32 activations/output and uint8 blocks")
    if x.stride(1) != 1 or out.stride(1) != 1 or not blocks.is_contiguous() or out.shape != (m, n):
        raise ValueError("gemm wants unit-stride rows, contiguous blocks and one output row per input row")
    rc = library().sd_gguf_gemm(ggml_type, blocks.data_ptr(), n, k, x.data_ptr(), m, x.stride(0), out.data_ptr(),
                                out.stride(0), threads or torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"the GGUF kernel refused type {ggml_type} with {k} inputs (rc {rc})")


def block_linear(desc: int, x: int, m: int, x_stride: int, out: int) -> None:
    """Run an ``execution/gguf_linear.BlockCalls`` at address ``desc`` on ``m`` float32 rows at ``x``
    (``x_stride`` floats apart) into the contiguous ``[m, out_features]`` at ``out``: one C call
    for a layer's kernel calls and bias (``GGUFLinear`` makes ~100 a decode step on the per-op
    path, so its tensors are checked once, when prepared)."""
    rc = library().sd_block_linear(desc, x, m, x_stride, out, torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"the GGUF kernels refused a block linear (rc {rc})")
