"""The text example: generated sentences of token ids and a small sentiment model trained on them
in about a second.

A vocabulary of ``VOCAB`` tokens holds ``SENTIMENT`` positive words (ids 1..20), as many negative
ones (21..40) and neutral filler (41..); id 0 is unused. A sentence is ``LENGTH`` tokens: filler
with a few sentiment words, labelled 1 (positive) when it holds more positive than negative words
(sentences with a tie are not generated). ``sentences(n, seed)`` draws them; ``train_model`` fits
an embedding, mean pooling and a two-layer head to 2000 sentences (seeded, full batch, Adam).

    python examples/text/sentiment_model.py   # trains and prints the held-out accuracy
"""

from __future__ import annotations

import torch

VOCAB, LENGTH, SENTIMENT, DIMENSION = 200, 16, 20, 16
#: Adam steps of the full-batch training.
STEPS = 200


def sentences(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids of shape (n, LENGTH), labels): filler with 1 to 5 sentiment words at random places."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2 * SENTIMENT + 1, VOCAB, (n, LENGTH), generator=g)
    words = torch.randint(1, 6, (n,), generator=g)
    positive = torch.rand(n, LENGTH, generator=g) < 0.5
    kind = torch.where(positive, torch.randint(1, SENTIMENT + 1, (n, LENGTH), generator=g),
                       torch.randint(SENTIMENT + 1, 2 * SENTIMENT + 1, (n, LENGTH), generator=g))
    places = torch.rand(n, LENGTH, generator=g).argsort(dim=1) < words[:, None]
    ids = torch.where(places, kind, ids)
    score = (places & positive).sum(1) - (places & ~positive).sum(1)
    keep = score != 0
    return ids[keep], (score[keep] > 0).long()


class Sentiment(torch.nn.Module):
    """Token ids -> embedding (``self.embedding``) -> mean over positions -> MLP -> two logits."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, DIMENSION)
        self.head = torch.nn.Sequential(torch.nn.Linear(DIMENSION, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(dim=1))


def train_model(seed: int = 0) -> Sentiment:
    """The model fitted to 2000 generated sentences (seeded)."""
    ids, y = sentences(2000, seed=1)
    torch.manual_seed(seed)
    model = Sentiment()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(ids), y).backward()
        opt.step()
    return model.eval()


def substitute(p: float):
    """A perturbation of token ids: each token is replaced, with probability p, by a uniformly
    drawn token of the vocabulary (a typo or an unknown word)."""
    def perturb(ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        swap = torch.rand(ids.shape, generator=generator, device=ids.device) < p
        drawn = torch.randint(1, VOCAB, ids.shape, generator=generator, device=ids.device)
        return torch.where(swap, drawn, ids)

    perturb.__qualname__ = f"substitute(p={p:g})"  # its name in reports and baselines
    return perturb


if __name__ == "__main__":
    model = train_model()
    ids, y = sentences(500, seed=2)
    with torch.no_grad():
        accuracy = (model(ids).argmax(1) == y).float().mean()
    norm = model.embedding.weight.norm(dim=1).mean()
    print(f"held-out accuracy {accuracy:.3f} on {len(y)} sentences; mean embedding norm {norm:.3f}")
