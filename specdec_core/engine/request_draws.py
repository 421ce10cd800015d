"""A request's random stream, replayable: a step draws its uniforms from a copy of the stream
(``stream_ahead``), and only the commit moves the request's own stream on (``commit_draws``).
A step that fails and runs again (a bisected batch) therefore draws the same numbers, and a
seeded request gets the same output whatever shares its batch.

``DrawStream`` is a part of the engine's ``Request`` (a base class of it); ``generator`` is
written by ``commit_draws`` alone, which only the commit calls.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only
    from specdec_core.decoding.sampling_params import SamplingParams


class DrawStream:
    """The random stream of one request (a base of ``engine.request.Request``, which sets the
    attributes below)."""

    params: SamplingParams
    generator: random.Random

    def stream_ahead(self) -> random.Random:
        """A copy of the request's own random stream for one step to draw its uniforms from (on
        the host, uploaded with the step): a seeded request draws the same numbers whatever
        shares its batch, on any device. The request's stream itself moves on only when the
        step commits (``commit_draws``), so a step that fails and runs again (a bisected batch)
        draws the same numbers again."""
        ahead = random.Random.__new__(random.Random)  # not seeded from the OS (~30 us): setstate sets it all
        ahead.setstate(self.generator.getstate())  # ~20 us in all per sampled request and step
        return ahead

    def commit_draws(self, ahead: random.Random | None) -> None:
        """The committed step's draws are spent: continue from the stream it drew from (None: it
        drew nothing)."""
        if ahead is not None:
            self.generator = ahead

    @property
    def seeded(self) -> bool:
        """A sampled request with its own seed: its draws, and so its speculation depth, must not
        depend on the batch."""
        return self.params.seed is not None and not self.params.greedy
