"""Turn a user's model argument into a ready-to-run model and tokenizer, never touching the network.

Accepted sources: a local Hugging Face directory, a hub id already in the local HF cache, a ``.gguf``
file, or ``None`` for the embedded default pair. A GGUF that the block kernels will serve (the
CPU default) is read straight from its file (``gguf_model``: nothing converted, nothing written).
Elsewhere (``--quantize none`` or int8, CUDA, an architecture ``gguf_model`` does not read) it is
dequantized by ``transformers``, which takes minutes for a 1.5B model, so it is converted once
into a plain fp32 safetensors directory under ``<cache_dir>/converted`` and every later start
loads that directory in seconds.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

import specdec_core.loading.default_models as default_models
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.execution.hf_types import HFModule
from specdec_core.loading.converted_blocks import RECORD, offer_file_blocks
from specdec_core.loading.gguf_model import GGUFSource, dequantize_blocks, load_gguf_model, readable
from specdec_core.loading.model_errors import ModelLoadError
from specdec_core.loading.progress_log import phase
from specdec_core.loading.stale_partials import remove_stale_partials

__all__ = ["LoadedModel", "ModelLoadError", "convert_gguf", "load_model", "remove_stale_partials"]

logger = logging.getLogger(__name__)

# Shards keep the peak memory of writing a 6 GB fp32 checkpoint to roughly one shard extra.
_SHARD_BYTES = 2 << 30
# "org/name" or "name": anything else that does not exist locally is reported as a missing path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, on its device, no grads) with its tokenizer."""

    model: HFModule
    tokenizer: PreTrainedTokenizerBase
    name: str  # human name: dir name, hub id, GGUF stem, or the default model's name
    path: Path  # the local HF directory actually loaded (the converted one), or the GGUF's metadata file
    source: GGUFSource | None = None  # the GGUF served from its file

    @property
    def identity(self) -> dict[str, Any]:
        """What identifies the weights (the step-cost cache's key): a GGUF source's identity, or a
        directory and the bytes of its weight files (a re-converted or replaced model of the same
        name gets a new key)."""
        if self.source is not None:
            return self.source.identity
        files = sorted(p for p in self.path.glob("*") if p.suffix in (".safetensors", ".bin", ".json"))
        return {"path": str(self.path.resolve()), "bytes": sum(p.stat().st_size for p in files)}


def load_model(
    source: str | os.PathLike[str] | None,
    *,
    role: str,
    profile: DeviceProfile,
    cache_dir: Path,
    progress: bool = True,
) -> LoadedModel:
    """Load ``source`` (see module docstring) for ``role`` ("target"/"draft") onto the profile's
    device and dtype (a GGUF that the profile's block kernels serve is read from its file).

    The weights stay as stored; ``ModelRunner`` prepares them for the profile's kernels
    (``linear_kernels``).
    """
    dev, dt = profile.device, profile.dtype
    gguf, name = _gguf_file(source, role, Path(cache_dir), progress)
    # every GGUF's header is checked here, whichever path then loads it (a bad one: ModelFileError)
    header = readable(gguf) if gguf is not None else None
    if gguf is not None and header is not None and profile.kernels == "gguf":
        where = f"its {len(gguf.parts)} parts" if gguf.split else gguf.parts[0]
        with phase(logger, f"loading the {role} model {name} from {where} (its own blocks, from the file)"):
            try:
                model, tokenizer = load_gguf_model(gguf, header)
            except (OSError, ValueError) as exc:
                raise ModelLoadError(f"could not load the {role} model from {where}: {exc}") from exc
        return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=gguf.metadata_file, source=gguf)
    path, name = (convert_gguf(gguf, Path(cache_dir)), name) if gguf is not None else _resolve_source(source)
    with phase(logger, f"loading the {role} model {name} from {path} ({str(dt).removeprefix('torch.')}, {dev})"):
        try:
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dt, attn_implementation="sdpa", local_files_only=True, output_loading_info=True
            )
            model, info = loaded  # (model, loading info): transformers' stubs type only the model
            _refuse_missing_weights(info, path)
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"could not load the {role} model from {path}: {exc}") from exc
        model.to(dev)
        model.eval()
        model.requires_grad_(False)
    offer_file_blocks(model, path)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=path)


def _gguf_file(source: str | os.PathLike[str] | None, role: str, cache_dir: Path, progress: bool
               ) -> tuple[GGUFSource | None, str]:
    """(the GGUF, human name) of a GGUF source or the default pair; (None, "") otherwise."""
    if source is None:
        return default_models.default_model_source(role, cache_dir, progress), default_models.default_model(role).name
    text = os.fspath(source)
    path = Path(text).expanduser()
    if not text.endswith(".gguf"):
        return None, ""
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    return GGUFSource.of_file(path), path.stem


def _resolve_source(source: str | os.PathLike[str] | None) -> tuple[Path, str]:
    """Map a non-GGUF source argument to (local HF directory, human name)."""
    text = os.fspath(source or "")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a Hugging Face model directory (no config.json)")
        return path, path.resolve().name
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model directory nor a .gguf file")
    if not _HUB_ID.fullmatch(text):
        raise ModelLoadError(f"model directory {path} does not exist")
    return _cached_hub_snapshot(text), text


def _refuse_missing_weights(info: dict[str, object], source: Path) -> None:
    """transformers silently initialises absent weights at random; serving those would be garbage."""
    missing = sorted(info.get("missing_keys") or [])  # type: ignore[call-overload]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise ModelLoadError(f"{source} lacks {len(missing)} weight tensors ({shown}); refusing random weights")


def _cached_hub_snapshot(repo_id: str) -> Path:
    """The local snapshot directory of ``repo_id``; specdec never downloads, whatever HF_HUB_OFFLINE says."""
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=True))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{repo_id!r} is not a local directory and is not in the local Hugging Face cache; "
            f"no download is attempted. Pass a local model directory or .gguf file, or populate the "
            f"HF cache (HF_HOME) on a machine with hub access. ({exc})"
        ) from exc
    if not (snapshot / "config.json").is_file():
        raise ModelLoadError(f"the cached snapshot {snapshot} of {repo_id!r} has no config.json")
    return snapshot


def convert_gguf(gguf: Path | GGUFSource, cache_dir: Path) -> Path:
    """Return the converted safetensors dir for ``gguf``, converting it on first use.

    The dir is keyed by the file's size and mtime (a split file: by its identity), and is written
    under a temporary name and renamed into place, so a directory with the final name is always a
    finished conversion.
    """
    source = gguf if isinstance(gguf, GGUFSource) else GGUFSource.of_file(gguf)
    if source.split:
        key = hashlib.sha256(json.dumps(source.identity, sort_keys=True).encode()).hexdigest()[:12]
    else:
        stat = source.parts[0].stat()
        key = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    root = cache_dir / "converted"
    final = root / f"{source.name.removesuffix('.gguf')}-{key}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(root)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    # Routine on a first start, so info: a warning would suggest something is wrong.
    with phase(logger, f"converting {source.name} to safetensors in {final} (once; later starts load it in seconds)"):
        try:
            _write_hf_dir(source, tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # otherwise a concurrent start finished the same conversion first
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_hf_dir(gguf: GGUFSource, out: Path) -> None:
    """Dequantize ``gguf`` and write weights (fp32), config, generation config and tokenizer to ``out``.

    An architecture ``gguf_model`` reads is read by it (seconds: ``gguf.GGUFReader``, which
    transformers' loader uses, parses the vocabulary for 20-40 s) and its blocks dequantized by
    the function transformers' loader calls; any other through transformers. ``save_pretrained``
    refuses GGUF-loaded models ("not serializable"), so the weights are written directly and the
    config is saved without its ``quantization_config``. A split file is read only by ``gguf_model``.
    """
    import transformers

    size = f"{sum(p.stat().st_size for p in gguf.parts) / 1e9:.1f} GB"
    with phase(logger, f"reading and dequantizing {gguf.name} ({size}) to float32"):
        if (header := readable(gguf)) is not None:
            model, tokenizer = load_gguf_model(gguf, header)
            dequantize_blocks(model)
        elif gguf.split:
            raise ModelLoadError(f"{gguf.name} is split into parts, and its architecture is not one read from them")
        else:
            file = gguf.parts[0]
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                str(file.parent), gguf_file=file.name, dtype=torch.float32, local_files_only=True,
                output_loading_info=True)
            model, info = loaded
            _refuse_missing_weights(info, file)
            tokenizer = None
    out.mkdir(parents=True)
    _save_weights(model, out)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    del model
    if tokenizer is None:
        with phase(logger, f"converting the tokenizer of {gguf.name}"):
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.metadata_file.parent), gguf_file=gguf.metadata_file.name)
    tokenizer.save_pretrained(out)
    provenance: dict[str, Any] = {"transformers": transformers.__version__, "identity": gguf.identity}
    if not gguf.split:  # a file the kernels can read their blocks from again (``converted_blocks.gguf_source``)
        stat = gguf.parts[0].stat()
        provenance.update(source=str(gguf.parts[0]), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    (out / RECORD).write_text(json.dumps(provenance, indent=1))


def _save_weights(model: HFModule, out: Path) -> None:
    """Write the state dict as (sharded) safetensors, dropping tied duplicates such as lm_head."""
    from safetensors.torch import save_file

    state = dict(model.state_dict())
    tied: dict[str, str] = getattr(model, "all_tied_weights_keys", None) or {}
    for dup, src in tied.items():  # the config keeps tie_word_embeddings, so loading re-ties them
        if dup in state and src in state and state[dup].data_ptr() == state[src].data_ptr():
            del state[dup]
    shards: list[dict[str, torch.Tensor]] = [{}]
    seen: set[int] = set()
    shard_bytes = 0
    for name, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr()
        tensor = tensor.detach().clone() if ptr in seen else tensor.detach().contiguous()
        seen.add(ptr)
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and shard_bytes + nbytes > _SHARD_BYTES:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += nbytes
    total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
    written = 0
    with phase(logger, f"writing {total / 1e9:.1f} GB of safetensors in {len(shards)} file(s)",
               lambda: f"{written} / {len(shards)} files written"):
        if len(shards) == 1:
            save_file(shards[0], out / "model.safetensors", metadata={"format": "pt"})
            return
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards, start=1):
            filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, out / filename, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, filename))
            written = i
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
