"""Check that a draft model speaks the same token ids as its target.

Speculative decoding compares the two models' distributions id by id, so the ids both can score must
mean the same strings. Only that shared range matters: Qwen checkpoints pad their embedding to 151936
rows while the tokenizer has fewer tokens, and a draft may be padded differently from its target.
"""

from __future__ import annotations

import logging

from specdec_core.execution.hf_types import HFModule
from specdec_core.loading.loader import LoadedModel, ModelLoadError

logger = logging.getLogger(__name__)


class IncompatibleModelsError(ModelLoadError):
    """The draft's token ids do not mean the same tokens as the target's."""


def output_vocab_size(model: HFModule) -> int:
    """Number of logits the model produces per position (works for int8-quantized heads too)."""
    head = model.get_output_embeddings()  # type: ignore[operator]
    size = getattr(head, "out_features", None)
    if size is None:
        size = model.config.get_text_config().vocab_size  # type: ignore[union-attr]
    return int(size)


def check_pair(target: LoadedModel, draft: LoadedModel) -> int:
    """Return the shared vocabulary size V, or raise ``IncompatibleModelsError``.

    V is the number of ids that the target's tokenizer can produce and both models can score; the
    engine restricts both distributions to ids < V. Every id below V must map to the same token
    (special tokens included) in both tokenizers.
    """
    shared = min(len(target.tokenizer), output_vocab_size(target.model), output_vocab_size(draft.model))
    target_ids = {i: tok for tok, i in target.tokenizer.get_vocab().items() if i < shared}
    draft_ids = {i: tok for tok, i in draft.tokenizer.get_vocab().items() if i < shared}
    differing = sorted(i for i in set(target_ids) | set(draft_ids) if target_ids.get(i) != draft_ids.get(i))
    if differing:
        examples = ", ".join(
            f"id {i}: target {target_ids.get(i)!r} vs draft {draft_ids.get(i)!r}" for i in differing[:5]
        )
        raise IncompatibleModelsError(
            f"draft {draft.name!r} and target {target.name!r} use different tokenizers: "
            f"{len(differing)} of the {shared} shared ids map to different tokens ({examples}"
            f"{', ...' if len(differing) > 5 else ''})"
        )
    if shared < len(target.tokenizer):
        logger.warning(
            "the models score only ids < %d but the tokenizer has %d tokens; higher ids are never produced",
            shared, len(target.tokenizer),
        )
    return shared
