"""Token ids through the model's embedding (the ``embedding=`` setting): the checks act on the
embedding's output, in its own units, while the model keeps taking token ids.

With ``embedding=`` (``"auto"``: a Hugging Face model's ``get_input_embeddings()``; a dotted name
such as ``"bert.embeddings.word_embeddings"``; or the module itself), a check's inputs are integer
token ids of any shape S. ``embedded`` computes the embedding vectors e = E(ids), of shape
S × d, once per check, in batches, in eval mode; they are the check's continuous inputs: noise,
smoothing, NPPR and attacks perturb them, and every size (eps, sigma, radius) is in the
embedding's units (the message states the mean norm of the vectors, to size them against).
``ThroughEmbedding`` is the model the check calls: given vectors e', it calls the model on
stand-in ids of shape S (the largest id in the data: a real token, not padding) while a
forward hook replaces E's output with e', so every
layer after E sees e' exactly as it would see E(ids) of a real input, gradients included.

That is sound only when the model reads the ids through E alone. ``embedded`` checks it on
``PROBE_INPUTS`` inputs spread over the data: the model's logits on the real ids must equal those of
``ThroughEmbedding`` on their clean vectors (within ``TOLERANCE`` of the largest logit); a model
that also reads the ids elsewhere (a padding mask computed from the ids, a second embedding of
them) is refused, naming the difference, rather than measured wrongly.

Padded inputs (items with an attention mask: ``padding``): the vector of a padded position is
marked (``padding.mark_padded``) so that no check moves it; ``ThroughEmbedding`` gives the model
the padding token's own vector there, the ids of the padding there and the mask, so the model sees
each input exactly as it would its real ids and mask.
"""

from __future__ import annotations

import contextlib

import torch

from pytest_robust.engine import padding
from pytest_robust.engine.inspect.labels import probe_rows
from pytest_robust.engine.interface import logits_of
from pytest_robust.errors import RobustDataError, RobustModelError, SettingError

#: Dtypes of embedding vectors that the checks hold in float32 (their working dtype).
REDUCED = (torch.float16, torch.bfloat16)
#: Inputs on which the model's logits through the real ids and through the embedding are compared.
PROBE_INPUTS = 16
#: Largest difference between those logits, as a share of their largest magnitude (float16 and
#: bfloat16 models round the two paths alike: the same layers see the same vectors).
TOLERANCE = 1e-3


def resolve(model: torch.nn.Module, spec) -> tuple[torch.nn.Module, str]:
    """(the embedding module, its name for messages) of ``spec``: "auto", a dotted name in the
    model, or a module (of the model, or any callable module). A SettingError names what exists."""
    if isinstance(spec, torch.nn.Module):
        name = next((n for n, m in model.named_modules() if m is spec), None)
        if name is None:
            raise SettingError("embedding", spec, "a module of the model (it is called inside model(ids)); this "
                                                  f"{type(spec).__name__} is not one of its submodules: pass the "
                                                  f"model's own, e.g. one of {_embeddings(model)}")
        return spec, name
    if spec == "auto":
        getter = getattr(model, "get_input_embeddings", None)
        if getter is None:
            raise SettingError("embedding", spec, "a dotted name or the module itself: the model has no "
                                                  f"get_input_embeddings() (auto is for Hugging Face models); its "
                                                  f"embedding modules: {_embeddings(model)}")
        module = getter()
        name = next((n for n, m in model.named_modules() if m is module), "get_input_embeddings()")
        return module, name
    try:
        return model.get_submodule(spec), spec
    except AttributeError:
        raise SettingError("embedding", spec, f"the dotted name of a module of the model; its embedding modules: "
                                              f"{_embeddings(model)}") from None


def _embeddings(model: torch.nn.Module) -> str:
    found = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)]
    return ", ".join(repr(n) for n in found[:6]) or "none (no torch.nn.Embedding)"


class ThroughEmbedding(torch.nn.Module):
    """The model on embedding vectors (module docstring): ``forward(vectors)`` calls the model on
    stand-in ids (``stand_in`` everywhere) of the vectors' shape less the last dimension, with the
    embedding's output replaced by the vectors. Where the vectors mark a padded position
    (``padding.real_positions``) the ids are the padding's (``pad``: its id and its vector), encoded
    as padded (``padding.encode``) for the model call (``padding.ModelCall``) to pass the mask."""

    def __init__(self, model: torch.nn.Module, embedding: torch.nn.Module, stand_in: int, pad=None):
        super().__init__()
        self.model, self.embedding, self.stand_in, self.pad = model, embedding, stand_in, pad

    def forward(self, vectors: torch.Tensor):
        ids = torch.full(vectors.shape[:-1], self.stand_in, dtype=torch.long, device=vectors.device)
        if self.pad is not None:
            real = padding.real_positions(vectors)
            ids = padding.encode(torch.where(real, ids, self.pad[0]), real)
            vectors = torch.where(real[..., None], vectors, self.pad[1].to(vectors))

        def replace(module, args, output):
            return vectors.to(output.dtype)

        handle = self.embedding.register_forward_hook(replace)
        try:
            return self.model(ids)
        finally:
            handle.remove()


def embedded(model: torch.nn.Module, spec, ids: torch.Tensor, batch_size: int, selector, device,
             call: torch.nn.Module | None = None) -> tuple:
    """(the model on vectors, the vectors of ``ids`` (float, on the ids' device), what to record):
    see the module docstring. The embedding runs on ``device`` (the model's) in eval mode, batch by
    batch; ``selector`` picks the logits (``interface.logits_of``). ``call`` is the model as the
    checks call it (``padding.calling``: with the mask and keywords of the items), default ``model``;
    ids of padded positions come encoded (``padding.encode``)."""
    call = model if call is None else call
    if ids.dtype.is_floating_point:
        raise RobustDataError(f"embedding= takes integer token ids, and these inputs are {ids.dtype}: pass the "
                              "token ids (the tokenizer's input_ids), or for continuous inputs give this check "
                              "embedding='none' (where --robust-embedding, robust_embedding in ini or a suite's "
                              "settings set it for every check) or leave embedding= out")
    module, name = resolve(model, spec)
    encoded, (ids, real) = ids, padding.decode(ids)
    table = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)  # e.g. in bert.embeddings
    vocabulary = getattr(module, "num_embeddings", None) or (None if table is None else table.num_embeddings)
    if isinstance(vocabulary, int) and (int(ids.max()) >= vocabulary or int(ids.min()) < 0):
        raise RobustDataError(f"token ids range from {int(ids.min())} to {int(ids.max())}, outside the vocabulary "
                              f"0..{vocabulary - 1} of embedding={name!r}: tokenize with the model's own tokenizer")
    try:
        with torch.no_grad(), _evaluating(model):
            vectors = torch.cat([module(ids[i:i + batch_size].to(device)).to(ids.device)
                                 for i in range(0, len(ids), batch_size)])
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        raise RobustModelError(f"embedding={name!r} cannot take token ids ({type(err).__name__}: {err}): name the "
                               f"module that maps the ids to vectors, e.g. one of {_embeddings(model)}") from None
    with torch.no_grad(), _evaluating(model):
        if not (isinstance(vectors, torch.Tensor) and vectors.dtype.is_floating_point
                and vectors.shape[:-1] == ids.shape):
            raise RobustModelError(f"embedding={name!r} must map token ids of shape {tuple(ids.shape[1:])} to vectors "
                                   f"of shape {tuple(ids.shape[1:])} x dimension; it returned "
                                   f"{tuple(vectors.shape) if isinstance(vectors, torch.Tensor) else type(vectors)}")
        pad = None if bool(real.all()) else _padding_token(module, ids, real, device)
        through = ThroughEmbedding(call, module, int(ids[real].max()), pad)
        if pad is not None:
            vectors = padding.mark_padded(vectors.float() if vectors.dtype in REDUCED else vectors, real)
        rows = probe_rows(len(ids), PROBE_INPUTS)
        _check_reads_ids_only(call, through, encoded[rows].to(device), vectors[rows].to(device), name, selector)
    norm = float(vectors[: 4096][real[: 4096]].float().norm(dim=-1).mean())
    facts = {"module": name, "dimension": int(vectors.shape[-1]), "mean_norm": norm,
             "space": f"the embedding space of {name!r} (dimension {vectors.shape[-1]}, mean vector norm {norm:.4g})"}
    return through, vectors.float() if vectors.dtype in REDUCED else vectors, facts


def _padding_token(module: torch.nn.Module, ids: torch.Tensor, real: torch.Tensor, device) -> tuple:
    """(id, vector) the model gets at padded positions: the id found most often there, and its
    embedding (the model masks those positions; ``_check_reads_ids_only`` holds it to that)."""
    pad = int(torch.mode(ids[~real]).values)
    return pad, module(torch.tensor([pad], device=device))[0].detach()


@contextlib.contextmanager
def _evaluating(model: torch.nn.Module):
    """The model in eval mode inside the block (dropout off), each module's mode restored after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def check_no_box(perturbation) -> None:
    """SettingError when the check's perturbation has a box: the embedding space has none, and
    vectors that happen to lie in (0, 1), the images' default, would be clamped in silence."""
    bounds = getattr(perturbation, "bounds", None)
    if bounds is not None:
        plain = all(isinstance(b, (int, float)) for b in bounds)
        default = "the default box (0, 1) is for images; " if plain and tuple(map(float, bounds)) == (0.0, 1.0) else ""
        raise SettingError("bounds", bounds, f"None with embedding= ({default}the embedding vectors have no box: "
                                             "give bounds=None)")


def check_perturbation_of_vectors(perturbation, ids: torch.Tensor) -> None:
    """With ``embedding=`` a perturbation acts on the embedding vectors. A callable that takes and
    returns token ids (a substitution) would be handed vectors and perturb them as numbers, so it is
    tried on two inputs' ids first and refused, with the fix, when it returns integers."""
    fn = getattr(perturbation, "fn", None)
    if fn is None or ids.dtype.is_floating_point:
        return
    try:
        out = fn(ids[:2].clone(), torch.Generator(device=ids.device).manual_seed(0))
    except (RuntimeError, TypeError, ValueError, IndexError):
        return  # a perturbation of vectors need not take ids at all
    if isinstance(out, torch.Tensor) and not out.dtype.is_floating_point:
        raise RobustDataError(
            f"perturbation {perturbation!r} takes and returns token ids, but with embedding= every check perturbs "
            "the embedding vectors: give this check embedding='none' (where --robust-embedding, ini or a suite "
            "sets it) to perturb the ids themselves, or a perturbation of vectors")


def _check_reads_ids_only(model, through, ids, vectors, name: str, selector) -> None:
    """RobustModelError unless the model's logits on ``ids`` are those through the embedding."""
    real = logits_of(model(ids), selector, len(ids)).float()
    replaced = logits_of(through(vectors), selector, len(ids)).float()
    gap = float((real - replaced).abs().max())
    if gap > TOLERANCE * max(1.0, float(real.abs().max())):
        raise RobustModelError(
            f"the model reads the token ids elsewhere than through embedding={name!r}: its logits on {len(ids)} "
            f"inputs spread over the data differ by up to {gap:.4g} when the ids reach it only through that module "
            "(a padding mask computed from the ids, a second embedding of them?), so the checks cannot perturb its "
            "inputs there; name the module every use of the ids goes through, or check the layers after it on the "
            "embedded inputs (docs: text and sequences)")
