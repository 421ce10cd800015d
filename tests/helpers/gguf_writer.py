"""Tiny random Phi-3 GGUF files, written as llama.cpp's ``convert_hf_to_gguf.py`` writes a Phi-3 /
Phi-4-mini (its ``Phi3MiniModel``), so the file-served path is checked on Phi-3's traits without a
hub download:

- metadata under ``phi3.``: context and embedding lengths, feed-forward length, block count, head
  counts, RMS epsilon, rotary dims (``rope.dimension_count``: fewer than the head's for a partial
  rotary model such as Phi-4-mini), rotary base, ``rope.scaling.original_context_length`` and the
  sliding window (llama.cpp writes it; llama.cpp and transformers both ignore it for Phi-3);
- a LongRoPE model's factors as the float32 tensors ``rope_factors_long.weight`` /
  ``rope_factors_short.weight`` and its ``rope.scaling.attn_factor``;
- tensors by llama.cpp's names: the fused ``attn_qkv`` (q, k, v rows in that order, not
  permuted: Phi-3 rotates in the rotate-half form, llama.cpp's NEOX rope) and the fused
  ``ffn_up`` (gate rows, then up rows), norms in float32, no ``output.weight`` when the head is
  tied to the embedding (Phi-4-mini);
- a small sentencepiece (``llama``) vocabulary, as Phi-3-mini's files carry, with byte fallback,
  control tokens and Phi-3's chat template.

The weights are seeded random blocks of formats the kernels run (``gguf_blocks.blocks_for``):
nothing here depends on a trained model, and a file of 2 layers of width 256 is written in well
under a second.
"""

from __future__ import annotations

import math
import string
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType

from tests.helpers.gguf_blocks import blocks_for

T = GGMLQuantizationType

# Formats a Q4_K_M file mixes, and the legacy ones: each tensor role gets a different one.
PHI3_TYPES = {"token_embd": T.Q8_0, "output": T.Q6_K, "attn_qkv": T.Q4_K, "attn_output": T.Q5_0,
              "ffn_up": T.Q6_K, "ffn_down": T.Q8_0}
PHI3_CHAT_TEMPLATE = ("{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] "
                      "+ '<|end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
                      "{% else %}{{ eos_token }}{% endif %}")
_WORDS = ("def", "quicksort", "arr", "return", "sorted", "the", "hello", "world", "print", "for", "in", "if",
          "else", "and", "is", "of", "to", "user", "assistant", "fibonacci", "x", "n")
_SPECIALS = ("<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>")


def spm_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a small sentencepiece vocabulary laid out as Phi-3's:
    ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens, pieces, then the chat tokens. Every word of
    ``_WORDS`` is reachable through merges of its prefixes (a longer piece scores higher)."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, *[TokenType.BYTE] * 256]
    pieces = dict.fromkeys(["\u2581", *string.ascii_letters, *string.digits, *"()[]:=,.+-<>"])
    for word in _WORDS:
        spelled = "\u2581" + word
        pieces.update(dict.fromkeys(spelled[:end] for end in range(2, len(spelled) + 1)))
        pieces.update(dict.fromkeys(word[:end] for end in range(2, len(word) + 1)))
    scores = [0.0] * len(tokens)
    for piece in pieces:
        tokens.append(piece)
        scores.append(-100.0 + len(piece) + 0.001 * len(tokens))  # distinct, longer pieces first
        types.append(TokenType.NORMAL)
    for special in _SPECIALS:
        tokens.append(special)
        scores.append(0.0)
        types.append(TokenType.CONTROL)
    return tokens, scores, [int(t) for t in types]


def write_phi3_gguf(out: Path, *, hidden: int = 256, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                    ffn: int = 512, context: int = 4096, original_context: int = 4096, rope_dims: int | None = None,
                    long_factors: list[float] | None = None, short_factors: list[float] | None = None,
                    tied: bool = False, sliding_window: int = 2047, rope_theta: float = 10000.0,
                    types: dict[str, GGMLQuantizationType] | None = None, seed: int = 0,
                    shapes: dict[str, tuple[int, int]] | None = None) -> Path:
    """Write a random Phi-3 to ``out`` (see module docstring); ``long_factors`` and
    ``short_factors`` (``rope_dims / 2`` each) make it a LongRoPE model; ``shapes`` writes the
    named tensors with other (rows, columns) than the model's (a malformed file)."""
    head_dim = hidden // heads
    rope_dims = rope_dims or head_dim
    types = {**PHI3_TYPES, **(types or {})}
    tokens, scores, token_types = spm_vocabulary()
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(out, "phi3")
    writer.add_name("tiny-phi3")
    writer.add_context_length(context)
    writer.add_rope_scaling_orig_ctx_len(original_context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(rope_dims)
    writer.add_rope_freq_base(rope_theta)
    writer.add_sliding_window(sliding_window)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(PHI3_CHAT_TEMPLATE)
    if long_factors is not None and short_factors is not None:
        if not len(long_factors) == len(short_factors) == rope_dims // 2:
            raise ValueError(f"LongRoPE factors must have {rope_dims // 2} entries each")
        scale = context / original_context
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(original_context)) if scale > 1.0 else 1.0
        writer.add_rope_scaling_attn_factors(attn_factor)
        writer.add_tensor("rope_factors_long.weight", np.array(long_factors, dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(short_factors, dtype=np.float32))
    counter = iter(range(seed * 1000, seed * 1000 + 1000))

    def blocks(name: str, role: str, rows: int, cols: int) -> None:
        rows, cols = (shapes or {}).get(name, (rows, cols))
        writer.add_tensor(name, blocks_for(types[role], rows, cols, seed=next(counter), scale=0.05),
                          raw_dtype=types[role])

    def norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.2 * rng.standard_normal(hidden)).astype(np.float32))

    blocks("token_embd.weight", "token_embd", len(tokens), hidden)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        blocks(f"blk.{i}.attn_qkv.weight", "attn_qkv", (heads + 2 * kv_heads) * head_dim, hidden)
        blocks(f"blk.{i}.attn_output.weight", "attn_output", hidden, heads * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        blocks(f"blk.{i}.ffn_up.weight", "ffn_up", 2 * ffn, hidden)
        blocks(f"blk.{i}.ffn_down.weight", "ffn_down", hidden, ffn)
    norm("output_norm.weight")
    if not tied:
        blocks("output.weight", "output", len(tokens), hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
