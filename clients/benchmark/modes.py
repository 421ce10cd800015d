"""What the bench measures: the servers' speculation modes and the transformers baselines."""

from __future__ import annotations

MODES = ("off", "draft", "ngram", "suffix", "auto")
BASELINES = ("hf", "hf_assisted", "hf_prompt_lookup")
MODE_TO_METHOD = {"off": "none", "draft": "draft", "ngram": "ngram", "suffix": "suffix", "auto": "auto"}
NEEDS_DRAFT = ("draft", "auto")
