#!/usr/bin/env python3
"""Two builds of the GGUF block kernels A/B in one process: the working tree's against a git
revision's (``--base``), or two kernel sets of the working tree's build (``--sets avx2,avx512-vnni``),
calls alternating, on every layer shape of the default target (Qwen2.5-Coder-1.5B Q4_K_M: its Q4_K
and Q6_K matrices; ``Q8_0-act16``: its shapes as a safetensors model is served on the CPU, Q8_0
made at load times 16-bit activations), M = 1 (a one-token step), 5 (verifying 4 drafts), 16 (a batch of 16 rows) and
512 rows (a prefill chunk; not for the head, which a prefill runs on its last row only).

The machine this was written on is shared, so only ratios within one run mean anything. Each
call uses the next of several copies of the weights (>= 80 MB in all), so they come from DRAM as
in a model step. Prints median (min) ms per call, B/A, and B's GB/s of weight bytes.

    python clients/tools/gguf_kernel_ab.py --base main --threads 1
    python clients/tools/gguf_kernel_ab.py --base HEAD~2 --types Q6_K --repeats 31
    python clients/tools/gguf_kernel_ab.py --sets avx2,avx512-vnni --threads 2
    python clients/tools/gguf_kernel_ab.py --sets avx512-vnni,amx-int8 --rows 1,5,9,16,512
    python clients/tools/gguf_kernel_ab.py --base HEAD~1 --types Q8_0-act16 --threads 2 --set avx2
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSRC = "specdec_core/kernels/csrc"
OLD_CSRC = "specdec_core/execution/csrc"  # where revisions before the C library's own package kept it
# (label, GGML type name, out_features, in_features)
SHAPES = [("q/o 1536x1536", "Q4_K", 1536, 1536), ("k/v 256x1536", "Q4_K", 256, 1536),
          ("v 256x1536", "Q6_K", 256, 1536), ("gate/up 8960x1536", "Q4_K", 8960, 1536),
          ("down 1536x8960", "Q4_K", 1536, 8960), ("down 1536x8960", "Q6_K", 1536, 8960),
          ("head 151936x1536", "Q6_K", 151936, 1536)]
SHAPES += [(label, "Q8_0-act16", n, k) for label, _, n, k in SHAPES[:1] + SHAPES[3:5] + SHAPES[6:]]
ACT16 = 0x200  # SD_ACT16 (c_library.ACT16): the type code's flag for 16-bit activations


def build(rev: str | None, out: Path) -> Path:
    """Compile the kernels of git revision ``rev`` (None: the working tree) into ``out``."""
    sys.path.insert(0, str(ROOT))
    from specdec_core.kernels.build_definition import CFLAGS

    src = ROOT / CSRC
    if rev is not None:
        src = out / f"src-{rev.replace('/', '_')}"
        src.mkdir()
        for folder in (CSRC, OLD_CSRC):
            listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:{folder}"],
                                    capture_output=True, text=True)
            if listed.returncode == 0:
                break
        else:
            raise SystemExit(f"{rev} has no C sources in {CSRC} or {OLD_CSRC}")
        for name in listed.stdout.split():
            blob = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{folder}/{name}"], check=True, capture_output=True)
            (src / name).write_bytes(blob.stdout)
    lib = out / f"lib-{'worktree' if rev is None else rev.replace('/', '_')}.so"
    sources = [str(p) for p in sorted(src.glob("gguf_*.c")) if p.name != "gguf_module.c"]
    subprocess.run(["cc", *CFLAGS, "-o", str(lib), *sources, "-lm"], check=True)
    return lib


ROWS = (1, 5, 16, 512)


def bind(path: Path) -> ctypes.CDLL:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib = ctypes.CDLL(str(path))
    lib.sd_gguf_gemm.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, i64, ptr, i64, ctypes.c_int]
    lib.sd_gguf_x8_type.argtypes = [ctypes.c_int]
    lib.sd_gguf_x8_size.argtypes = [ctypes.c_int, i64, i64]
    lib.sd_gguf_x8_size.restype = i64
    # the thread count came later (an older build ignores the extra argument)
    lib.sd_gguf_x8_repack.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, ctypes.c_int]
    lib.sd_gguf_set_impl(0)
    return lib


def prepare(lib: ctypes.CDLL, qtype: int, raw, n: int, k: int):
    """(type code, bytes) in the layout this build multiplies (repacked where it repacks);
    ``qtype`` may carry ACT16."""
    import torch

    code = lib.sd_gguf_x8_type(qtype)
    size = lib.sd_gguf_x8_size(qtype, n, k) if code else 0
    if not size:
        return qtype, raw
    packed = torch.empty(size, dtype=torch.uint8)
    if lib.sd_gguf_x8_repack(qtype, raw.data_ptr(), n, k, packed.data_ptr(), 1) != 0:
        raise RuntimeError("repack failed")
    return code, packed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD", help="git revision for A (B is the working tree)")
    p.add_argument("--sets", help="A,B: two kernel sets of the working tree's build instead (e.g. avx2,avx512-vnni)")
    p.add_argument("--set", help="with --base: the kernel set both builds run (default: the best this CPU runs)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--types", default="Q4_K,Q6_K", help="comma list of the GGML types to time")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma list of M (activation rows) to time")
    args = p.parse_args(argv)
    rows = tuple(int(m) for m in args.rows.split(","))
    import numpy as np
    import torch
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with tempfile.TemporaryDirectory() as tmp:
        if args.sets:  # one build, the set chosen before each call (the repacked layout is the same)
            from specdec_core.kernels.c_library import KERNEL_SET_CODES

            set_a, set_b = args.sets.split(",")
            lib = bind(build(None, Path(tmp)))
            libs = {"A": (lib, KERNEL_SET_CODES[set_a]), "B": (lib, KERNEL_SET_CODES[set_b])}
            for name in (set_a, set_b):
                if lib.sd_gguf_set_impl(KERNEL_SET_CODES[name]) != KERNEL_SET_CODES[name]:
                    raise SystemExit(f"this CPU does not run the kernel set {name}")
            what = f"A = {set_a}, B = {set_b} (the working tree's build)"
        else:
            from specdec_core.kernels.c_library import KERNEL_SET_CODES

            impl = KERNEL_SET_CODES[args.set] if args.set else 0
            libs = {"A": (bind(build(args.base, Path(tmp))), impl), "B": (bind(build(None, Path(tmp))), impl)}
            what = f"A = {args.base}, B = working tree, kernels {args.set or 'the best'}"
    rng = np.random.default_rng(0)
    print(f"{what}; {args.threads} thread(s), {args.repeats} calls each; ms median (min)")
    print("| shape | type | M | A | B | B/A | B GB/s |\n|---|---|---|---|---|---|---|")
    for label, type_name, n, k in SHAPES:
        if type_name not in args.types.split(","):
            continue
        qtype = GGMLQuantizationType[type_name.removesuffix("-act16")]
        block, size = GGML_QUANT_SIZES[qtype]
        nbytes = n * (k // block) * size
        raws = []
        for _ in range(max(1, -(-(80 << 20) // nbytes))):
            raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
            # small positive fp16 scales (Q6_K: d; Q4_K: d and dmin; Q8_0: d): random ones can be inf or NaN
            scales = slice(208, 210) if type_name == "Q6_K" else slice(0, 2) if qtype == GGMLQuantizationType.Q8_0 else slice(0, 4)
            raw[..., scales] = 0x10
            raws.append(torch.from_numpy(raw.reshape(n, -1)))
        kind = int(qtype) | (ACT16 if type_name.endswith("-act16") else 0)
        weights = {name: [prepare(lib, kind, r, n, k) for r in raws] for name, (lib, _) in libs.items()}
        del raws
        for m in rows:
            if m > 16 and label.startswith("head"):
                continue
            x = torch.randn(m, k)
            outs = {name: torch.empty(m, n) for name in libs}
            times: dict[str, list[float]] = {name: [] for name in libs}
            for it in range(args.repeats + 1):  # the first round warms up
                for name, (lib, impl) in libs.items():
                    code, data = weights[name][it % len(weights[name])]
                    lib.sd_gguf_set_impl(impl)
                    t0 = time.perf_counter()
                    rc = lib.sd_gguf_gemm(code, data.data_ptr(), n, k, x.data_ptr(), m, k, outs[name].data_ptr(), n,
                                          args.threads)
                    if it:
                        times[name].append((time.perf_counter() - t0) * 1e3)
                    if rc != 0:
                        raise RuntimeError(f"{name}: rc {rc}")
            same = "" if torch.equal(outs["A"], outs["B"]) else " (results differ)"
            a, b = (statistics.median(times[s]) for s in "AB")
            print(f"| {label}{same} | {type_name} | {m} | {a:.3f} ({min(times['A']):.3f}) | {b:.3f} ({min(times['B']):.3f}) "
                  f"| {b / a:.2f} | {nbytes / b / 1e6:.1f} |", flush=True)
        del weights
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
