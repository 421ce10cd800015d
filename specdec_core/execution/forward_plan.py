"""What one batched forward is made of: each request's part (``ForwardItem``), and the host
half of the forward (``ForwardPlan``: every index it needs, placed in a step's ``HostUpload``).

Why its own module: the step (``engine.speculative_step``), the draft model and the cost
model build forwards, and the runner's attention layouts plan them; none of them needs the
runner's internals to say what a forward is.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec_core.execution.decode_graphs import Bucket
from specdec_core.execution.host_upload import HostUpload, Ref
from specdec_core.execution.kv_cache import token_rows


@dataclass
class ForwardPlan:
    """The host half of one forward: every index it needs, placed in a step's ``HostUpload``
    (so a step with several forwards uploads once); ``ModelRunner.run`` does the rest."""

    refs: dict[str, Ref]
    num_logits: int
    # native, segmented: row, q_len, base, kv_len, group (index into ``gathers`` or -1: a slice)
    segments: list[tuple[int, int, int, int, int]] | None = None
    gathers: list[Ref] | None = None  # native, segmented: cache rows of requests not in one run
    packed_shape: Bucket | None = None  # native, packed: groups, rows and keys per group
    bucketed: bool = False  # native, packed: runs in its bucket's static shape (``decode_graphs``)
    key_range: tuple[int, int] | None = None  # transformers path, one request: its contiguous keys


@dataclass
class ForwardItem:
    """One request's part of a batched forward.

    ``blocks`` is its block table (``kv_cache``), covering every position fed; ``start`` is how
    many of its tokens are already cached; ``tokens`` are fed at positions
    ``start..start+len(tokens)-1``; logits are returned for the last ``num_logits`` of them. The
    last ``num_drafts`` tokens are speculative: each is attended on its own, exactly as if it were
    decoded alone (see ``native_decoder``). ``draft_paths``: the drafts form a token tree,
    ``draft_paths[j]`` being the drafts from the root's child down to draft j:
    draft j sits at position ``start + known + len(draft_paths[j]) - 1`` and attends to the known
    tokens and its path only, its keys written at cache position ``start + known + j`` (None: a
    chain, draft j's path being drafts 0..j; ``supports_trees`` says where trees run). ``extra_logits``: logits also come back for that many
    rows before the last ``num_logits`` (a prompt's rows, for its log-probabilities); they follow
    every item's last ``num_logits`` rows, so the rows verification reads keep their places.
    """

    blocks: list[int]
    start: int
    tokens: list[int]
    num_logits: int
    num_drafts: int = 0
    extra_logits: int = 0
    draft_paths: list[list[int]] | None = None

    def positions(self) -> list[int]:
        """Each fed token's position (a tree's drafts share positions by depth)."""
        end = self.start + len(self.tokens)
        if self.draft_paths is None:
            return list(range(self.start, end))
        known_end = end - self.num_drafts
        return list(range(self.start, known_end)) + [known_end + len(a) - 1 for a in self.draft_paths]


def token_lists(items: list[ForwardItem], block_size: int) -> dict[str, list[int]]:
    """What every forward needs, whichever path: token ids, positions, the flat cache rows they
    are written to, and the rows whose logits come back (each item's last ``num_logits``, then
    every item's ``extra_logits``)."""
    ids: list[int] = []
    pos: list[int] = []
    write: list[int] = []
    logit_rows: list[int] = []
    extra_rows: list[int] = []
    for it in items:
        n, row = len(it.tokens), len(ids)
        ids += it.tokens
        pos += it.positions()
        write += token_rows(it.blocks, block_size, it.start, it.start + n)
        logit_rows += range(row + n - it.num_logits, row + n)
        extra_rows += range(row + n - it.num_logits - it.extra_logits, row + n - it.num_logits)
    return {"ids": ids, "pos": pos, "write": write, "logit_rows": logit_rows + extra_rows}


def token_refs(items: list[ForwardItem], block_size: int, upload: HostUpload) -> tuple[dict[str, Ref], int]:
    """``token_lists`` placed in ``upload``, and how many logit rows come back."""
    lists = token_lists(items, block_size)
    return {name: upload.ints(values) for name, values in lists.items()}, len(lists["logit_rows"])
