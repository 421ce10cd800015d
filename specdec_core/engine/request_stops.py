"""Where a request's generation stops at the token level: an EOS or stop id, ``max_tokens``, or
the model's length. (Stop strings are decided on the text, by the detokenizer.)

``TokenStops`` is a part of the engine's ``Request`` (a base class of it): the rule reads the
request and writes nothing; the commit cuts the step's tokens where it says and finishes the
request with its reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only
    from specdec_core.decoding.sampling_params import SamplingParams
    from specdec_core.engine.outputs import FinishReason


class TokenStops:
    """The token-level stop rule of one request (a base of ``engine.request.Request``, which sets
    the attributes below)."""

    params: SamplingParams
    all_ids: list[int]
    output_ids: list[int]

    def token_stop(self, new: list[int], eos_ids: set[int], max_model_len: int) -> tuple[list[int], FinishReason | None]:
        """``new`` cut at the first token-level stop: EOS / stop ids, max_tokens, max_model_len."""
        p = self.params
        if p.max_tokens == 0:
            return [], "length"  # the prompt was only to be scored
        for i, t in enumerate(new):
            if t in p.stop_token_ids or (not p.ignore_eos and t in eos_ids):
                return new[: i + 1], "stop"
            if len(self.output_ids) + i + 1 >= p.max_tokens or len(self.all_ids) + i + 1 >= max_model_len:
                return new[: i + 1], "length"
        return new, None
