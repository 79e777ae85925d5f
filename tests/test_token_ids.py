"""Token ids as inputs: with embedding= every check acts on the embedding's output (by name,
"auto" or the module; through every door); TSRM (and its paired form) also takes integer inputs
with a perturbation of the user's that takes and returns them (a random token substitution);
otherwise integer inputs are refused naming the fixes for counts and for token ids. On generated
sentences and a bag-of-embeddings model whose weights are set by hand (no training), and a tiny
randomly initialised BERT."""

from __future__ import annotations

import warnings

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
                                                  r"x.float\(\).*token ids: give embedding= .* every check perturbs "
                                                  r"the embedding's output; or, for tsrm, a perturbation of your "
                                                  r"own") as caught:
        call(BagOfEmbeddings(), sentences(20))
    assert "ToTensor" not in str(caught.value) and "255" not in str(caught.value)


def test_a_substitution_that_returns_floats_is_named():
    with pytest.raises(pr.ArgumentError, match=r"torch.int64 in, torch.float32 out"):
        pr.tsrm(BagOfEmbeddings(), sentences(20), perturbation=lambda ids, g: ids.float(), budget=100)


# -- embedding=: the checks act on the embedding's output -------------------------------------------------------

NOISE = pr.GaussianNoise(sigma=0.5, bounds=None)


def test_embedding_by_name_or_module_measures_the_embedded_inputs_and_states_their_norm():
    model, (ids, y) = BagOfEmbeddings(), sentences()
    by_name = pr.tsrm(model, (ids, y), perturbation=NOISE, budget=3000, embedding="embedding")
    by_module = pr.tsrm(model, (ids, y), perturbation=NOISE, budget=3000, embedding=model.embedding)
    with torch.no_grad():
        vectors = model.embedding(ids)

    class Rest(torch.nn.Module):  # the layers after the embedding, by hand
        def forward(self, v):
            m = v.mean(dim=(1, 2))
            return torch.stack([-m, m], dim=1)

    by_hand = pr.tsrm(Rest(), (vectors, y), perturbation=NOISE, budget=3000)
    assert by_name.estimate == by_module.estimate == by_hand.estimate
    norm = float(vectors.norm(dim=-1).mean())
    assert by_name.details["embedding"]["mean_norm"] == pytest.approx(norm, rel=1e-6)
    assert f"in the embedding space of 'embedding' (dimension 1, mean vector norm {norm:.4g})" in by_name.message()


@pytest.mark.parametrize("check", ["adversarial", "certified", "nppr"])
def test_the_gradient_and_smoothing_checks_act_on_the_embedding(check):
    model, (ids, y) = BagOfEmbeddings(), sentences(64)
    if check == "adversarial":  # the mean of 12 one-number vectors moves by eps: 3 majority tokens survive 0.2
        r = pr.adversarial_accuracy(model, (ids, y), eps=0.2, bounds=None, steps=5, embedding="embedding")
        broken = pr.adversarial_accuracy(model, (ids, y), eps=1.0, bounds=None, steps=5, embedding="embedding")
        assert r.estimate == 1.0 and broken.estimate == 0.0
    elif check == "certified":
        r = pr.certified_accuracy(model, (ids, y), sigma=0.25, radius=0.1, embedding="embedding")
        assert r.estimate > 0.9
    else:
        r = pr.nppr(model, (ids, y), eps=0.2, bounds=None, latent_dim=2, components=2, fit_steps=3, fit_batch_size=8,
                    draws_per_input=2, budget=20_000, embedding="embedding")
        assert 0 <= r.estimate <= 1
    assert "embedding space of 'embedding'" in r.message()


def test_a_hugging_face_model_takes_embedding_auto():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=LENGTH)
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(config).eval()
    ids, y = sentences(32)
    r = pr.tsrm(bert, (ids, y), perturbation=pr.GaussianNoise(sigma=0.1, bounds=None), budget=500, embedding="auto")
    assert r.details["embedding"]["module"] == "bert.embeddings.word_embeddings" and r.draws == 500
    a = pr.adversarial_accuracy(bert, (ids, y), eps=0.05, bounds=None, steps=3, square_queries=5, embedding="auto")
    assert 0 <= a.estimate <= 1


class PaddingAware(BagOfEmbeddings):
    """Reads the ids a second time: a mask of the non-padding tokens (id 0 pads)."""

    def forward(self, ids):
        keep = (ids != 0).float()
        m = (self.embedding(ids).squeeze(-1) * keep).sum(1) / keep.sum(1).clamp(min=1)
        return torch.stack([-m, m], dim=1)


def test_a_model_that_reads_the_ids_beyond_the_embedding_is_refused():
    ids, y = sentences()
    ids[:, -4:] = 0  # padding, which the model masks by reading the ids
    with pytest.raises(pr.RobustModelError, match=r"reads the token ids elsewhere than through embedding='embedding': "
                                                   r"its logits on 16 inputs spread over the data differ"):
        pr.tsrm(PaddingAware(), (ids, y), perturbation=NOISE, budget=100, embedding="embedding")


@pytest.mark.parametrize("spec, error", [
    ("embeding", r"embedding='embeding' is invalid: expected the dotted name of a module of the model; its "
                 r"embedding modules: 'embedding'"),
    ("auto", r"the model has no get_input_embeddings\(\)"),
    ("not a name", r"embedding='not a name' is invalid"),
])
def test_an_embedding_that_is_not_there_is_a_setting_error(spec, error):
    with pytest.raises(pr.SettingError, match=error):
        pr.tsrm(BagOfEmbeddings(), sentences(), perturbation=NOISE, budget=100, embedding=spec)


def test_embedding_on_continuous_inputs_and_with_normalize_are_refused():
    with pytest.raises(pr.RobustDataError, match=r"embedding= takes integer token ids, and these inputs are "
                                                  r"torch.float32"):
        pr.tsrm(BagOfEmbeddings(), (torch.rand(10, 12), torch.zeros(10, dtype=torch.long)), perturbation=NOISE,
                budget=100, embedding="embedding")
    with pytest.raises(pr.SettingError, match=r"None with embedding="):
        pr.tsrm(BagOfEmbeddings(), sentences(), perturbation=NOISE, budget=100, embedding="embedding",
                normalize=(0.5, 0.25))


PAD = 3  # the padding token: a real row of the embedding (its vector is not zero)


class MaskedBag(BagOfEmbeddings):
    """A Hugging Face-like forward(input_ids, attention_mask, token_type_ids): the mean embedding over
    the real tokens. Records, for every call, the ids and embedding vectors at padded positions and the
    keywords it got; refuses labels (a Hugging Face forward would compute a loss)."""

    def __init__(self):
        super().__init__()
        with torch.no_grad():
            self.embedding.weight[PAD] = 0.7
        self.padded_ids, self.padded_vectors, self.keywords = [], [], []

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None):
        assert labels is None, "labels reached the model"
        e = self.embedding(input_ids).squeeze(-1)
        pad = attention_mask == 0
        self.padded_ids.append(input_ids[pad].detach())
        self.padded_vectors.append(e[pad].detach())
        self.keywords.append(None if token_type_ids is None else token_type_ids.detach())
        keep = attention_mask.to(e.dtype)
        m = (e * keep).sum(1) / keep.sum(1)
        return torch.stack([-m, m], dim=1)


def padded_sentences(n: int = 60, pad: int = PAD):
    """(ids, attention mask, labels): sentences of 5..LENGTH tokens, right-padded with ``pad``."""
    ids, y = sentences(n)
    lengths = torch.randint(5, LENGTH + 1, (n,), generator=torch.Generator().manual_seed(3))
    mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
    return torch.where(mask.bool(), ids, pad), mask, y


class Items(torch.utils.data.Dataset):
    """The Hugging Face datasets shape: input_ids, attention_mask, token_type_ids (the same for every
    input), label, and an idx the model does not take."""

    def __init__(self, ids, mask, y):
        self.ids, self.mask, self.y = ids, mask, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "label": self.y[i], "idx": i,
                "token_type_ids": torch.zeros(LENGTH, dtype=torch.long)}


PADDED_CHECKS = {
    "tsrm": lambda m, d: pr.tsrm(m, d, perturbation=pr.GaussianNoise(sigma=0.5, bounds=None), budget=600,
                                 embedding="embedding"),
    "adversarial": lambda m, d: pr.adversarial_accuracy(m, d, eps=0.5, bounds=None, steps=5, square_queries=10,
                                                        embedding="embedding"),
    "certified": lambda m, d: pr.certified_accuracy(m, d, sigma=0.25, radius=0.1, budget=20000,
                                                    embedding="embedding"),
}


@pytest.mark.parametrize("check", PADDED_CHECKS)
@pytest.mark.parametrize("form", ["mapping", "pair"])
def test_padded_inputs_pass_their_mask_and_padding_is_never_perturbed(check, form):
    ids, mask, y = padded_sentences()
    model = MaskedBag()
    if form == "pair":  # ((input_ids, attention_mask), labels): the mask goes in positionally
        data = ((ids, mask), y)
    else:
        data = Items(ids, mask, y)
    r = PADDED_CHECKS[check](model, data)
    assert 0 <= r.lower <= r.estimate <= r.upper <= 1
    # every call saw the padding token and its own vector at every padded position: never perturbed
    assert len(model.padded_ids) > 2 and all(bool((i == PAD).all()) for i in model.padded_ids)
    assert all(torch.allclose(v, torch.full_like(v, 0.7)) for v in model.padded_vectors)
    assert sum(map(len, model.padded_ids)) > 0
    if form == "mapping":  # token_type_ids, the same for every input, reach the model with each batch
        assert all(k is not None and not bool(k.any()) for k in model.keywords)
    # masked positions do not count: another padding token gives the same numbers
    other = PADDED_CHECKS[check](MaskedBag(), Items(*padded_sentences(pad=11)))
    assert (other.estimate, other.lower, other.upper) == (r.estimate, r.lower, r.upper)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_padding_is_kept_in_reduced_and_double_precision(dtype):
    model, data = MaskedBag().to(dtype), Items(*padded_sentences())
    r = PADDED_CHECKS["tsrm"](model, data)
    pad = model.embedding.weight[PAD, 0]
    assert all(bool((v == pad).all()) for v in model.padded_vectors) and sum(map(len, model.padded_vectors)) > 0
    # as test_embedding_with_reduced_and_double_precision_models: the same figure within 0.02
    assert abs(r.estimate - PADDED_CHECKS["tsrm"](MaskedBag(), data).estimate) <= 0.02


def test_a_substitution_of_padded_token_ids_gets_the_real_ids_and_keeps_the_padding():
    ids, mask, y = padded_sentences()
    seen = []

    def perturb(x, generator):
        seen.append(x.clone())
        return substitute(0.5)(x, generator)

    model = MaskedBag()
    r = pr.tsrm(model, ((ids, mask), y), perturbation=perturb, budget=600)
    assert 0 < r.estimate < 1 and all(int(x.max()) < VOCAB for x in seen)
    assert all(bool((i == PAD).all()) for i in model.padded_ids) and sum(map(len, model.padded_ids)) > 0


def test_values_the_model_takes_must_be_the_same_for_every_input():
    ids, mask, y = padded_sentences(20)

    class Pairs(Items):
        def __getitem__(self, i):
            return {**super().__getitem__(i), "token_type_ids": torch.arange(LENGTH) % 2 * (i % 2)}

    with pytest.raises(pr.RobustDataError, match=r"the data's items carry 'token_type_ids', which differs between "
                                                  r"inputs: a check passes the model the attention mask of each input"):
        pr.tsrm(MaskedBag(), Pairs(ids, mask, y), perturbation=NOISE, budget=100, embedding="embedding")


def test_padding_needs_a_forward_that_takes_the_mask_and_token_ids():
    ids, mask, y = padded_sentences(20)
    with pytest.raises(pr.RobustModelError, match=r"carry an attention mask 'attention_mask' with padded positions, "
                                                   r"and the model's forward takes no attention_mask keyword"):
        pr.tsrm(BagOfEmbeddings(), Items(ids, mask, y), perturbation=NOISE, budget=100, embedding="embedding")
    with pytest.raises(pr.RobustModelError, match=r"the inputs are \(input, attention_mask\) pairs, which a check "
                                                   r"passes to the model as model\(input, mask\), and the model's "
                                                   r"forward takes one argument"):
        pr.tsrm(BagOfEmbeddings(), ((ids, mask), y), perturbation=NOISE, budget=100, embedding="embedding")
    x = torch.randn(20, LENGTH, 4)
    with pytest.raises(pr.RobustDataError, match=r"the inputs are continuous and their attention mask has padded "
                                                  r"positions"):
        pr.tsrm(torch.nn.Linear(4, 2), ((x, mask), y), perturbation=NOISE, budget=100)


@pytest.mark.parametrize("data", ["padded", "plain"])
def test_a_box_in_the_embedding_space_is_refused(data):
    """Vectors inside (0, 1), the images' default box, would be clamped in silence."""
    model = MaskedBag() if data == "padded" else BagOfEmbeddings()
    with torch.no_grad():
        model.embedding.weight.uniform_(0.2, 0.8)
    items = Items(*padded_sentences(20)) if data == "padded" else sentences(20)
    with pytest.raises(pr.SettingError, match=r"bounds=\(-5, 5\) is invalid: expected None with embedding="):
        pr.tsrm(model, items, perturbation=pr.GaussianNoise(sigma=0.1, bounds=(-5, 5)), budget=100,
                embedding="embedding")
    with pytest.raises(pr.SettingError, match=r"the default box \(0, 1\) is for images"):
        pr.tsrm(model, items, perturbation=pr.UniformLinf(eps=0.3), budget=100, embedding="embedding")


def test_a_mask_under_another_name_is_read_and_named():
    ids, mask, y = padded_sentences(20)

    class Renamed(Items):
        def __getitem__(self, i):
            return {"ids": self.ids[i], "mask": self.mask[i], "y": self.y[i]}

    with pytest.raises(pr.RobustModelError, match=r"carry an attention mask 'mask' with padded positions, and the "
                                                   r"model's forward takes no mask keyword \(the mask reaches the "
                                                   r"forward under its key's name: rename the key"):
        pr.tsrm(MaskedBag(), Renamed(ids, mask, y), perturbation=NOISE, budget=100, embedding="embedding",
                data_keys=("ids", "y"))

    class TakesMask(MaskedBag):
        def forward(self, input_ids, mask):
            return super().forward(input_ids, attention_mask=mask)

    model = TakesMask()
    pr.tsrm(model, Renamed(ids, mask, y), perturbation=NOISE, budget=100, embedding="embedding", data_keys=("ids", "y"))
    assert all(bool((i == PAD).all()) for i in model.padded_ids) and sum(map(len, model.padded_ids)) > 0


def test_int32_ids_with_padding_and_a_constant_position_read_as_they_are():
    ids, mask, y = padded_sentences()
    ids[:, 0] = GOOD  # the same token first in every sentence (a [CLS]): its vector never varies
    with warnings.catch_warnings():
        warnings.simplefilter("error", pr.RobustWarning)
        warnings.filterwarnings("ignore", "tied top logits", pr.RobustWarning)
        r = pr.tsrm(MaskedBag(), ((ids.int(), mask), y), perturbation=pr.GaussianNoise(sigma=0.3, bounds=None),
                    budget=300, embedding="embedding")
    assert r.draws == 300


def test_items_of_different_lengths_are_told_to_pad():
    ids, mask, y = padded_sentences(20)

    class Ragged(Items):
        def __getitem__(self, i):
            n = int(self.mask[i].sum())
            return {"input_ids": self.ids[i, :n], "label": self.y[i]}

    with pytest.raises(pr.RobustDataError, match=r"the items have inputs of different lengths .*pad them to one "
                                                  r"length, with an attention_mask"):
        pr.tsrm(MaskedBag(), Ragged(ids, mask, y), perturbation=NOISE, budget=100, embedding="embedding")


def test_the_spread_of_padded_embeddings_leaves_the_padding_out():
    with pytest.warns(pr.RobustWarning, match=r"sigma \(50\) is [0-9.]+ times the standard deviation of feature "
                                             r"\(\d+, 0\), [0-9.]+, over the 60 inputs given") as caught:
        pr.tsrm(MaskedBag(), Items(*padded_sentences()), perturbation=pr.GaussianNoise(sigma=50, bounds=None),
                budget=100, embedding="embedding")
    assert not any("nan" in str(w.message) or "inf " in str(w.message) for w in caught)
    text = next(str(w.message) for w in caught if "sigma (50)" in str(w.message))
    assert "(a tensor over the last axis) (docs: text and sequences)" in text and "scaler" not in text


def test_items_without_padding_read_as_plain_token_ids():
    ids, y = sentences(20)
    full = pr.tsrm(MaskedBag(), Items(ids, torch.ones_like(ids), y), perturbation=NOISE, budget=500,
                   embedding="embedding")
    assert full.estimate == pr.tsrm(BagOfEmbeddings(), (ids, y), perturbation=NOISE, budget=500,
                                    embedding="embedding").estimate


def test_embedding_reaches_the_check_from_a_marker_the_command_line_and_yaml(pytester):
    pytester.makeconftest(f"""
import sys
sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
import pytest
from test_token_ids import BagOfEmbeddings, sentences


@pytest.fixture
def robust_model():
    return BagOfEmbeddings()


@pytest.fixture
def robust_data():
    return sentences()


def factory_model():
    return BagOfEmbeddings()


def factory_data():
    return sentences()
""")
    pytester.makepyfile(test_marker="""
import pytest
from pytest_robust import GaussianNoise

@pytest.mark.robust(tsrm=0.8, perturbation=GaussianNoise(sigma=0.5, bounds=None), embedding="embedding", budget=3000)
def test_marker():
    pass

@pytest.mark.robust(tsrm=0.8, perturbation=GaussianNoise(sigma=0.5, bounds=None), budget=3000)
def test_command_line():
    pass
""")
    pytester.makefile(".yaml", robust_tokens="""
model: conftest:factory_model
data: conftest:factory_data
settings:
  embedding: embedding
checks:
  - name: yaml
    tsrm: 0.8
    perturbation: {GaussianNoise: {sigma: 0.5, bounds: null}}
    budget: 3000
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-embedding", "embedding", "--robust-report", "rep")
    result.assert_outcomes(passed=3)
    import json

    results = json.loads((pytester.path / "rep" / "results.json").read_text())["results"]
    assert len({r["estimate"] for r in results}) == 1
    assert all(r["details"]["embedding"]["module"] == "embedding" for r in results)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_embedding_with_reduced_and_double_precision_models(dtype):
    model, (ids, y) = BagOfEmbeddings().to(dtype), sentences()
    r = pr.tsrm(model, (ids, y), perturbation=NOISE, budget=2000, embedding="embedding")
    reference = pr.tsrm(BagOfEmbeddings(), (ids, y), perturbation=NOISE, budget=2000, embedding="embedding")
    assert r.precision == str(dtype).removeprefix("torch.")
    # float64 draws its noise in float64 (other numbers), and a reduced-precision model rounds a few
    # borderline means the other way: the same figure within 0.02 (the 95% interval is about +-0.013)
    assert abs(r.estimate - reference.estimate) <= 0.02


def test_inputs_of_more_than_two_tensors_are_named_with_the_fix():
    ids, y = sentences(10)
    with pytest.raises(pr.RobustDataError, match=r"the inputs are 3 tensors: a check perturbs one input tensor and "
                                                  r"passes the model at most one more, its attention mask"):
        pr.tsrm(BagOfEmbeddings(), ((ids, torch.ones_like(ids), ids), y), perturbation=NOISE, budget=100,
                embedding="embedding")


# -- what a new user gets wrong with token ids ------------------------------------------------------------------


class GRUClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding, self.rnn = torch.nn.Embedding(VOCAB, 4), torch.nn.GRU(4, 4, batch_first=True)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, ids):
        return self.head(self.rnn(self.embedding(ids))[1][0])


def test_an_embedding_that_cannot_take_ids_or_is_not_the_models_is_named():
    ids, y = sentences(20)
    with pytest.raises(pr.RobustModelError, match=r"embedding='rnn' cannot take token ids .* e.g. one of "
                                                   r"'embedding'"):
        pr.tsrm(GRUClassifier(), (ids, y), perturbation=NOISE, budget=100, embedding="rnn")
    with pytest.raises(pr.SettingError, match=r"a module of the model .* this Embedding is not one of its "
                                              r"submodules"):
        pr.tsrm(BagOfEmbeddings(), (ids, y), perturbation=NOISE, budget=100, embedding=BagOfEmbeddings().embedding)
    r = pr.tsrm(GRUClassifier(), (ids, y), perturbation=NOISE, budget=100, embedding="embedding")
    assert r.details["embedding"]["dimension"] == 4


def test_token_ids_outside_the_vocabulary_are_named():
    ids, y = sentences(20)
    with pytest.raises(pr.RobustDataError, match=r"token ids range from \d+ to 94, outside the vocabulary 0..49"):
        pr.tsrm(BagOfEmbeddings(), (ids + 45, y), perturbation=NOISE, budget=100, embedding="embedding")
    with pytest.raises(pr.RobustDataError, match=r"the model cannot take token ids from \d+ to \d+ .* a perturbation "
                                                  r"of your own, that it draws ids below the vocabulary size"):
        pr.tsrm(BagOfEmbeddings(), (ids, y), perturbation=lambda t, g: t + 1000, budget=100)


def test_items_of_python_lists_read_as_their_tensors():
    ids, y = sentences(20)

    class Lists(torch.utils.data.Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return {"input_ids": ids[i].tolist(), "attention_mask": [1] * LENGTH, "label": int(y[i])}

    lists = pr.tsrm(BagOfEmbeddings(), Lists(), perturbation=NOISE, budget=500, embedding="embedding")
    tensors = pr.tsrm(BagOfEmbeddings(), (ids, y), perturbation=NOISE, budget=500, embedding="embedding")
    assert lists.estimate == tensors.estimate


def test_corruptions_on_token_ids_say_images_only():
    with pytest.raises(pr.ArgumentError, match="is for images only"):
        pr.corruption_accuracy(BagOfEmbeddings(), sentences(20), budget=100)


def test_an_image_perturbation_on_token_ids_gets_token_advice():
    """A corruption on token ids names what works for them (the embeddings, or a substitution of
    the ids), not noise in features' units (which refuses integers) or a channels-last layout."""
    with pytest.raises(pr.ArgumentError, match="are token ids, not images: perturb the model's embeddings") as err:
        pr.tsrm(BagOfEmbeddings(), sentences(20), perturbation=pr.Corruption("jpeg_compression", 3), budget=100)
    assert "bounds=None" not in str(err.value) and "permute" not in str(err.value)


def test_a_global_embedding_is_switched_off_per_check_and_named_on_continuous_inputs(pytester):
    pytester.makeconftest("""
import pytest
import torch

@pytest.fixture
def robust_model():
    return torch.nn.Linear(3, 2)

@pytest.fixture
def robust_data():
    return torch.randn(40, 3), torch.randint(0, 2, (40,))
""")
    pytester.makepyfile(test_features="""
import pytest
from pytest_robust import GaussianNoise

@pytest.mark.robust(tsrm=0.01, perturbation=GaussianNoise(sigma=0.1, bounds=None), budget=200)
def test_inherits():
    pass

@pytest.mark.robust(tsrm=0.01, perturbation=GaussianNoise(sigma=0.1, bounds=None), budget=200, embedding="none")
def test_switched_off():
    pass
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-embedding", "embedding", "-W",
                                "ignore::pytest_robust.errors.RobustWarning")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*give this check embedding='none' (where --robust-embedding*"])


# -- found in review --------------------------------------------------------------------------------------------


def test_a_callable_logits_selector_is_applied_once_by_the_label_probe():
    class Scores(BagOfEmbeddings):
        def forward(self, ids):
            return {"scores": super().forward(ids)}

    ids, y = sentences(40)
    r = pr.tsrm(Scores(), (ids, y), perturbation=substitute(0.1), budget=200, logits=lambda out: out["scores"])
    assert r.details["label_probe"]["inputs"] == 40


def test_a_substitution_with_embedding_is_refused_naming_embedding_none():
    with pytest.raises(pr.RobustDataError, match=r"takes and returns token ids, but with embedding= every check "
                                                  r"perturbs the embedding vectors: give this check "
                                                  r"embedding='none'"):
        pr.tsrm(BagOfEmbeddings(), sentences(20), perturbation=substitute(0.1), budget=100, embedding="embedding")


def test_a_model_with_a_padding_mask_runs_on_data_without_padding():
    class Masked(BagOfEmbeddings):  # id 0 pads; the data holds none
        def forward(self, ids):
            keep = (ids != 0).float()
            m = (self.embedding(ids).squeeze(-1) * keep).sum(1) / keep.sum(1).clamp(min=1)
            return torch.stack([-m, m], dim=1)

    r = pr.tsrm(Masked(), sentences(), perturbation=NOISE, budget=500, embedding="embedding")
    assert r.draws == 500


def test_list_items_of_a_dataset_are_pairs_not_transposed():
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 0, 1])

    class Lists(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return [x[i].tolist(), int(y[i])]

    from pytest_robust.engine.data import load_data

    ds = load_data(Lists())
    assert torch.allclose(ds.x, x) and ds.y.tolist() == y.tolist()


# -- two ranks with uneven shares -----------------------------------------------------------------------------

RANKED = {
    "tsrm": lambda: pr.tsrm(BagOfEmbeddings(), sentences(63), perturbation=NOISE, budget=1000, embedding="embedding"),
    "adversarial": lambda: pr.adversarial_accuracy(BagOfEmbeddings(), sentences(63), eps=0.3, bounds=None, steps=3,
                                                   square_queries=10, embedding="embedding"),
    "certified": lambda: pr.certified_accuracy(BagOfEmbeddings(), sentences(63), sigma=0.5, radius=0.1, max_draws=500,
                                               embedding="embedding"),
    "padded tsrm": lambda: PADDED_CHECKS["tsrm"](MaskedBag(), Items(*padded_sentences(63))),
    "padded adversarial": lambda: PADDED_CHECKS["adversarial"](MaskedBag(), Items(*padded_sentences(63))),
}


def _embedded_rank(rank: int, world: int, port: int, out: str) -> None:
    import json
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        found = {name: [r.estimate, r.lower, r.upper, r.draws] for name, r in
                 ((name, check()) for name, check in RANKED.items())}
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(found, f)
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_embedding_checks_on_two_ranks_with_uneven_shares_give_the_single_process_numbers(tmp_path):
    """63 sentences over two ranks: 32 and 31 inputs (and blocks) each; padded ones too."""
    import json

    import torch.multiprocessing as mp
    from test_check_shape import _free_port

    single = {name: [r.estimate, r.lower, r.upper, r.draws] for name, r in
              ((name, check()) for name, check in RANKED.items())}
    mp.spawn(_embedded_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == json.loads(json.dumps(single))


def test_a_kwargs_forward_is_warned_about_values_that_differ_between_inputs_and_runs():
    ids, mask, y = padded_sentences(20)

    class Kwargs(MaskedBag):
        def forward(self, input_ids, **kwargs):
            assert "idx" not in kwargs
            return super().forward(input_ids, kwargs["attention_mask"])

    class Numbered(Items):  # a GLUE-style idx per item
        def __getitem__(self, i):
            return {**super().__getitem__(i), "idx": torch.tensor(i)}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = pr.tsrm(Kwargs(), Numbered(ids, mask, y), perturbation=NOISE, budget=100, embedding="embedding")
    assert r.draws == 100
    assert any("carry 'idx', which differs between inputs, and the model's forward takes it only through **kwargs: "
               "it is left out" in str(w.message) for w in caught)


def test_numpy_pairs_and_three_part_items_are_read_or_named():
    ids, mask, y = padded_sentences(20)
    model = MaskedBag()
    r = pr.tsrm(model, ((ids.numpy(), mask.numpy()), y), perturbation=NOISE, budget=100, embedding="embedding")
    assert r.draws == 100 and all(bool((i == PAD).all()) for i in model.padded_ids)
    with pytest.raises(pr.RobustDataError, match=r"got tuple of 3; for items of \(input_ids, attention_mask, label\), "
                                                  r"as a TensorDataset gives, pass \(\(input_ids, attention_mask\), "
                                                  r"labels\)"):
        pr.tsrm(model, torch.utils.data.TensorDataset(ids, mask, y), perturbation=NOISE, budget=100,
                embedding="embedding")


def test_an_input_of_padding_only_is_named():
    ids, mask, y = padded_sentences(20)
    mask[7] = 0
    with pytest.raises(pr.RobustDataError, match=r"input 7 has no real token: its attention mask is all 0"):
        pr.tsrm(MaskedBag(), ((ids, mask), y), perturbation=NOISE, budget=100, embedding="embedding")


def test_a_segmentation_mask_of_image_items_is_not_an_attention_mask():
    x, y = torch.rand(12, 3, 8, 8), torch.randint(0, 2, (12,))

    class Segmented(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return {"image": x[i], "mask": (x[i, 0] > 0.5).long(), "label": y[i]}

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 2))
    r = pr.tsrm(model, Segmented(), perturbation=pr.UniformLinf(eps=0.01), budget=100)
    assert r.estimate == pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.01), budget=100).estimate
