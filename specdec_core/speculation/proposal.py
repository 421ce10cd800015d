"""What proposers hand the verifier (a leaf module: every proposer builds one)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    """``tokens[b]`` are item b's drafts (possibly fewer than asked). ``probs`` is ``[B, K, V]``
    with the distributions they were drawn from (one-hot rows for looked-up tokens), or None when
    every row is one-hot. ``draft_cached[b]``, when the draft model ran, is how many of item b's
    tokens its cache now holds (drafts included); the engine's commit turns that into the
    request's ``draft_computed``. Proposing moves no request state, so a step that fails after
    it leaves nothing to undo."""

    tokens: list[list[int]]
    probs: torch.Tensor | None
    draft_cached: list[int | None] | None = None
