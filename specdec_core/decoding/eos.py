"""Which token ids end a generation: one rule for the engine and the bench's transformers baselines.

Both must stop on the same ids, or the bench compares runs of different lengths.
"""

from __future__ import annotations

from typing import Any

# End-of-generation tokens that checkpoints often leave out of their generation config (llama.cpp
# stops on these too): Qwen's GGUF lists only <|im_end|>, yet <|endoftext|> ends a turn as well.
END_OF_GENERATION_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every EOS id declared by the generation config, the model config or the tokenizer, plus the
    end-of-turn tokens of ``END_OF_GENERATION_TOKENS`` that the vocabulary has."""
    vocab = tokenizer.get_vocab()
    ids: set[int] = {vocab[t] for t in END_OF_GENERATION_TOKENS if t in vocab}
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        val = getattr(src, "eos_token_id", None)
        if isinstance(val, int):
            ids.add(val)
        elif isinstance(val, (list, tuple)):
            ids.update(int(v) for v in val)
    return ids
