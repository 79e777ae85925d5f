"""Token ids as inputs: TSRM (and its paired form) takes integer inputs with a perturbation of the
user's that takes and returns them (a random token substitution); every other check, and the
built-in noise, refuse integer inputs naming the fixes for counts and for token ids. On generated
sentences and a bag-of-embeddings model whose weights are set by hand (no training)."""

from __future__ import annotations

import pytest
import torch

import pytest_robust as pr

pytestmark = pytest.mark.filterwarnings("ignore::pytest_robust.errors.RobustWarning")

VOCAB, LENGTH, GOOD, BAD = 50, 12, 7, 9


class BagOfEmbeddings(torch.nn.Module):
    """Positive iff the sentence holds more GOOD tokens than BAD ones: the mean of a one-number
    embedding (+1 for GOOD, -1 for BAD, 0 otherwise), and logits (-m, m). Records the dtypes it saw."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, 1)
        with torch.no_grad():
            self.embedding.weight.zero_()
            self.embedding.weight[GOOD], self.embedding.weight[BAD] = 1.0, -1.0
        self.seen: set = set()

    def forward(self, ids):
        self.seen.add(ids.dtype)
        m = self.embedding(ids).mean(dim=(1, 2))
        return torch.stack([-m, m], dim=1)


def sentences(n: int = 200, seed: int = 0):
    """(ids, labels): n sentences of LENGTH token ids with a clear majority of GOOD or BAD tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, VOCAB, (n, LENGTH), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    ids[:, :3] = torch.where(y[:, None] == 1, GOOD, BAD)
    return ids, y


def substitute(p: float):
    """A random token substitution: each token is replaced, with probability p, by a uniform token."""
    def perturb(ids, generator):
        swap = torch.rand(ids.shape, generator=generator, device=ids.device) < p
        random = torch.randint(0, VOCAB, ids.shape, generator=generator, device=ids.device)
        return torch.where(swap, random, ids)
    return perturb


def test_tsrm_takes_token_ids_with_a_substitution_of_the_users():
    model, (ids, y) = BagOfEmbeddings(), sentences()
    unchanged = pr.tsrm(model, (ids, y), perturbation=substitute(0.0), budget=2000)
    assert unchanged.estimate == 1.0 and model.seen == {torch.int64}
    noisy = pr.tsrm(model, (ids, y), perturbation=substitute(0.5), budget=4000, seed=1)
    assert 0.3 < noisy.estimate < 0.99 and noisy.lower <= noisy.estimate <= noisy.upper
    again = pr.tsrm(model, (ids, y), perturbation=substitute(0.5), budget=4000, seed=1)
    assert (again.estimate, again.lower, again.upper) == (noisy.estimate, noisy.lower, noisy.upper)


def test_the_paired_gate_compares_two_models_on_the_same_substitutions():
    model, (ids, y) = BagOfEmbeddings(), sentences()
    r = pr.tsrm(model, (ids, y), perturbation=substitute(0.3), reference=BagOfEmbeddings(), max_drop=0.05,
                budget=4000)
    assert r.verdict == "pass" and "0 draws right only for the reference, 0 only for the candidate" in r.message()


@pytest.mark.parametrize("call", [
    lambda m, d: pr.tsrm(m, d, perturbation=pr.UniformLinf(eps=0.1, bounds=None), budget=100),
    lambda m, d: pr.adversarial_accuracy(m, d, eps=0.1, bounds=None),
    lambda m, d: pr.certified_accuracy(m, d, sigma=0.25, radius=0.1),
])
def test_integer_inputs_elsewhere_are_refused_naming_the_fixes_for_counts_and_token_ids(call):
    with pytest.raises(pr.RobustDataError, match=r"got torch.int64\): numeric features such as counts: pass "
                                                  r"x.float\(\).*token ids: tsrm .* takes them with a perturbation "
                                                  r"of your own.*embedding output") as caught:
        call(BagOfEmbeddings(), sentences(20))
    assert "ToTensor" not in str(caught.value) and "255" not in str(caught.value)


def test_a_substitution_that_returns_floats_is_named():
    with pytest.raises(pr.ArgumentError, match=r"torch.int64 in, torch.float32 out"):
        pr.tsrm(BagOfEmbeddings(), sentences(20), perturbation=lambda ids, g: ids.float(), budget=100)
