"""The pieces of the distribution tests (speculative sampling, plain and constrained): a model over
a vocabulary small enough to enumerate every two-token continuation, the chi-square test of sampled
counts against exact probabilities, and the negative control (a verifier with the classic bias)."""

from __future__ import annotations

from pathlib import Path

import torch
from scipy.stats import chisquare

from specdec_core.decoding.sampling import sample
from specdec_core.speculation.verifier import VerifyResult, verify

VOCAB = 16
SAMPLES = 10_000


def build_small_vocab_model(out: Path, seed: int, tokenizer_dir: Path, noise: float = 0.0) -> Path:
    """A one-layer Llama over ``VOCAB`` tokens with peaked (not degenerate) output distributions;
    ``noise`` > 0 perturbs its weights into a related model that agrees with the unperturbed one
    only partly (a draft)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # peaked but not degenerate distributions
        if noise:
            # A related but different model: the draft agrees with the target only partly.
            gen = torch.Generator().manual_seed(seed + 1000)
            for w in model.parameters():
                w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """The chi-square test's p-value of sampled ``counts`` against the exact ``probs`` (a sample of
    a continuation with probability zero fails at once)."""
    expected = probs * counts.sum()
    # Pool cells with small expectations, as the test's approximation requires.
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    assert counts[probs == 0].sum() == 0, "sampled a continuation the target gives zero probability"
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    exp = exp * (obs.sum() / exp.sum())  # float round-off only
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


def biased_verify(p, q, drafts, num_drafts, u_accept, u_final) -> VerifyResult:
    """The classic mistake: after a rejection, resample from p instead of norm(max(0, p - q))."""
    res = verify(p, q, drafts, num_drafts, u_accept, u_final)
    final = sample(p[torch.arange(p.shape[0]), torch.tensor(res.num_accepted)], u_final)
    return VerifyResult(res.num_accepted, final.tolist())
