"""A GGUF model's metadata and tensors, checked against each other before the model is built.

Why: a file that parses can still describe a model its tensors are not. Served anyway, such a
file fails later and worse: an embedding of 100 rows for a 49,152-token vocabulary served and then
failed every request; an output projection with swapped dimensions served (the block kernels
trust a weight's row length, so a wrong one reads past its activations). And the metadata sizes
what is built before any tensor is read: a block count of 2^40 builds layers until the process
is killed, a head dimension of 2^40 allocates its rotary table. So the config values the model is
built from are checked first (``check_config``: positive integers, sizes the tensors bound,
every layer present, the embedding and output head of the vocabulary and width the metadata
names), and each tensor is checked against the parameter it becomes as it is read
(``check_tensor``). Every failure is a ``ModelFileError`` naming the key or tensor.
"""

from __future__ import annotations

import math
from typing import Any

from specdec_core.loading.gguf_file import GGUFFile
from specdec_core.loading.model_errors import ModelFileError

EMBEDDING, OUTPUT = "token_embd.weight", "output.weight"
MAX_CONTEXT = 2**31 - 1  # positions are int32 in the kernels; the longest real context is ~10M
# Config values that size the model: positive integers (the ones a tensor bounds are in _BOUNDED).
_SIZES = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
          "head_dim", "vocab_size", "max_position_embeddings")
_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")  # no default is this file's
_BOUNDED = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id")
_POSITIVE_REALS = ("rope_theta", "rms_norm_eps")


def check_config(file: GGUFFile, values: dict[str, Any], keys: dict[str, str]) -> None:
    """Check the config ``values`` derived from ``file``'s metadata (``keys``: the metadata key
    each came from) against the file's tensors, before a model is built from them."""

    def fail(target: str, expected: str, found: object) -> ModelFileError:
        return ModelFileError(file.name, keys.get(target, target), expected, found)

    for target in _SIZES:
        value = values.get(target, "no such key" if target in _REQUIRED else None)
        if value is not None and (type(value) is not int or value < 1):
            raise fail(target, "a positive integer", value)
    for target in _POSITIVE_REALS:
        value = values.get(target)
        if target in values and (not isinstance(value, (int, float)) or type(value) is bool or not 0 < value < math.inf):
            raise fail(target, "a positive finite number", value)
    if values.get("max_position_embeddings", 1) > MAX_CONTEXT:
        raise fail("max_position_embeddings", f"at most {MAX_CONTEXT} positions", values["max_position_embeddings"])
    embedding = file.tensors.get(EMBEDDING)
    if embedding is None or len(embedding.shape) != 2:
        raise ModelFileError(file.name, EMBEDDING, "the token embedding, [hidden size, vocabulary] dimensions",
                             "no such tensor" if embedding is None else list(embedding.shape))
    hidden, rows = embedding.shape
    if values.get("hidden_size") != hidden:
        raise fail("hidden_size", f"{hidden} ({EMBEDDING}'s first dimension)", values.get("hidden_size"))
    if values["vocab_size"] != rows:
        raise ModelFileError(file.name, f"{EMBEDDING} rows", f"{values['vocab_size']}, the vocabulary "
                             f"({keys.get('vocab_size', 'vocab_size')})", rows)
    tokens = file.metadata.get("tokenizer.ggml.tokens")
    if type(tokens) is not int or not 0 < tokens <= rows:
        raise ModelFileError(file.name, "tokenizer.ggml.tokens", f"an array of 1 to {rows} strings, one per "
                             f"row of {EMBEDDING}", tokens if type(tokens) is int else type(tokens).__name__)
    for target in _TOKEN_IDS:
        value = values.get(target)
        if target in values and (type(value) is not int or not 0 <= value < rows):
            raise fail(target, f"a token id below the vocabulary's {rows}", value)
    output = file.tensors.get(OUTPUT)
    if output is not None and output.shape != (hidden, rows):
        raise ModelFileError(file.name, f"{OUTPUT} dimensions", f"[{hidden}, {rows}] (hidden size, vocabulary)",
                             list(output.shape))
    largest = max(max(info.shape) for info in file.tensors.values())
    for target in _BOUNDED:
        if values.get(target, 1) > largest:
            raise fail(target, f"at most {largest}, the largest dimension of any tensor", values[target])
    heads, kv_heads = values.get("num_attention_heads", 1), values.get("num_key_value_heads", 1)
    if heads % kv_heads:
        raise fail("num_key_value_heads", f"a divisor of the {heads} attention heads", kv_heads)
    _check_layers(file, values.get("num_hidden_layers", 0), keys.get("num_hidden_layers", "num_hidden_layers"))


def _check_layers(file: GGUFFile, layers: int, key: str) -> None:
    """Every layer the block count names has tensors (``blk.N.*``): the model builds that many."""
    numbers = (name.split(".")[1] for name in file.tensors if name.startswith("blk."))
    present = {int(n) for n in numbers if n.isascii() and n.isdigit()}
    if layers > len(present):
        raise ModelFileError(file.name, key, f"at most the {len(present)} layers the tensors hold (blk.N.*)", layers)
    missing = next((i for i in range(layers) if i not in present), None)
    if missing is not None:
        raise ModelFileError(file.name, f"blk.{missing}", f"the tensors of layer {missing} of {layers} ({key})",
                             "no such tensors")


def check_tensor(file: GGUFFile, gguf_name: str, shape: tuple[int, ...], owner: str) -> None:
    """Check that ``gguf_name`` exists and has the dimensions of parameter ``owner`` (``shape``,
    torch order: GGUF stores them innermost first)."""
    info = file.tensors.get(gguf_name)
    expected = list(reversed(shape))
    if info is None:
        raise ModelFileError(file.name, gguf_name, f"a tensor of dimensions {expected} for {owner}", "no such tensor")
    if list(info.shape) != expected:
        raise ModelFileError(file.name, f"{gguf_name} dimensions", f"{expected} for {owner} of the model "
                             "the metadata describes", list(info.shape))
