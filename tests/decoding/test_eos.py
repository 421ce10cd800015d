"""The EOS-id rule shared by the engine and the bench's transformers baselines."""

from __future__ import annotations

from types import SimpleNamespace

from specdec_core.decoding.eos import eos_token_ids


class _Tok:
    eos_token_id = 2

    def get_vocab(self) -> dict[str, int]:
        return {"<|endoftext|>": 0, "<|im_end|>": 7, "hello": 9}


def test_every_declared_id_and_the_end_of_turn_tokens_count() -> None:
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[3, 4]),
                            config=SimpleNamespace(eos_token_id=5))
    assert eos_token_ids(model, _Tok()) == {0, 2, 3, 4, 5, 7}


def test_a_model_without_generation_config_still_works() -> None:
    model = SimpleNamespace(config=SimpleNamespace(eos_token_id=None))
    assert eos_token_ids(model, _Tok()) == {0, 2, 7}
