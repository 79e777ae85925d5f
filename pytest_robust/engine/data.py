"""Data as a check holds it: ``TensorData`` (inputs and labels as tensors), read once from an
(x, y) pair of any container ``containers.as_tensor`` reads (tensors, numpy, pandas, scipy.sparse),
a Dataset or a DataLoader (``load_data``), each item read as (input, label)
(``input_and_label``: mapping items by their common key names or by the ``data_keys`` setting)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from pytest_robust.engine.containers import as_tensor
from pytest_robust.engine.inspect.data import check_finite, check_loader_order, check_reads_repeat, is_image_batch
from pytest_robust.engine.items import input_and_label, parts
from pytest_robust.engine.padding import Extras, split
from pytest_robust.engine.streams import host_rng
from pytest_robust.errors import (
    RobustDataError,
)


@dataclass
class TensorData:
    """Inputs and integer labels held as two tensors, x of shape (n, ...) and y of shape (n,)."""

    x: torch.Tensor
    y: torch.Tensor
    extras: Extras | None = None  # what the items hold for the model besides x (``padding``)

    def __len__(self) -> int:
        return self.y.shape[0]  # not len(): a tensor's __len__ costs a microsecond of Python


def load_data(data, keys: tuple[str, str] | None = None, discrete: bool = False) -> TensorData:
    """Materialise an (x, y) pair, a torch Dataset of (x, y) items or of mappings (``input_and_label``),
    or a DataLoader into tensors, detached from any autograd graph; mapping items are read by ``keys``
(the check's ``data_keys``), else by their common names.

    A single input with one label (an unbatched (x, y) pair, a Dataset item) is refused with the
    fix (add the batch dimension), never read as len(x) inputs. A Dataset or DataLoader is read in
    index order (a shuffling loader is re-read with a sequential sampler) under a fixed global RNG
    that is restored afterwards, so the data, and every number computed from it, depend only on
    the check's seed. Inputs with NaN or infinite values are refused, naming the first such input
    (``inspect.data.check_finite``). Integer inputs (token ids) are kept as they are with
    ``discrete`` (a check and perturbation that take them: ``Metric.discrete``), else refused with
    the fixes for counts and for token ids.
    """
    if isinstance(data, TensorData):
        return data
    x, y, rest = _read(data, keys)
    x, extras = split(as_tensor(x, "inputs").detach(), rest)  # requires_grad
    return _checked(x, as_tensor(y, "labels").detach(), discrete, extras)


def _read(data, keys) -> tuple:
    """(x, y, what else the items hold for the model: ``padding.split``) of an (x, y) pair, a
    Dataset or a DataLoader (``load_data``), not yet checked."""

    if isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], (tuple, list)):
        _check_aligned(*data)
        return *data, {}
    if isinstance(data, (tuple, list)) and len(data) == 2:
        inputs = data[0]
        if _pair(inputs):  # numpy parts too
            inputs = tuple(torch.as_tensor(p) for p in inputs)
        if all(isinstance(p, torch.Tensor) for p in inputs) and len(inputs) != len(data[1]) or _pair(inputs):
            return *parts(inputs)[:1], data[1], parts(inputs)[1]
        _check_aligned(*data)
        return *data, {}  # inputs as a list of rows (numbers, or one tensor per input)
    if isinstance(data, torch.utils.data.DataLoader) or isinstance(data, torch.utils.data.Dataset):
        return _read_items(data, keys)
    raise RobustDataError(
        "data must be an (x, y) pair (tensors, numpy arrays, a pandas DataFrame and Series, scipy.sparse "
        f"features), a torch Dataset of (input, label) items or a DataLoader, got {type(data).__name__}"
    )


def _read_items(data, keys) -> tuple:
    """``_read`` of a Dataset or a DataLoader: every batch's (input, label, the rest), joined."""
    if isinstance(data, torch.utils.data.DataLoader):
        loader = check_loader_order(data)
    else:
        loader = torch.utils.data.DataLoader(data, batch_size=512, shuffle=False, collate_fn=_collate)
    check_reads_repeat(loader.dataset, keys)
    xs, ys, rests = [], [], []
    with host_rng(0):
        try:
            for batch in loader:
                inputs, labels, rest = input_and_label(batch, keys)
                xs.append(as_tensor(inputs, "inputs"))
                ys.append(as_tensor(labels, "labels"))
                rests.append(rest)
        except (IndexError, KeyError) as error:
            raise RobustDataError(_unreadable(loader.dataset, sum(map(len, ys)), error)) from error
        except RuntimeError as error:
            if "equal size" not in str(error):
                raise
            raise RobustDataError(
                f"the items have inputs of different lengths ({error}): a check holds one tensor per batch, so "
                "pad them to one length, with an attention_mask for the padding (the tokenizer's "
                "padding='max_length', or a DataLoader with a padding collate_fn); docs: text and sequences"
            ) from None
    if not isinstance(data, torch.utils.data.DataLoader):  # a loader may read a subset on purpose
        _check_all_read(loader.dataset, sum(map(len, ys)))
    if not xs:
        raise RobustDataError("the data is empty: the dataset or loader yielded no items")
    return torch.cat(xs), torch.cat(ys), _joined(rests)


def _pair(inputs) -> bool:
    """Whether the inputs part of an (x, y) pair is (input_ids, attention_mask): two tensors of
    one shape (the rows of the inputs as a list are one input each)."""
    return (len(inputs) == 2 and all(hasattr(p, "shape") and hasattr(p, "ndim") for p in inputs)
            and inputs[0].ndim >= 2 and tuple(inputs[0].shape) == tuple(inputs[1].shape))


def _joined(rests: list) -> dict:
    """The values of every batch's rest (``items.input_and_label``) joined by key; a key that
    some batches lack, or whose values do not join, is left out (not the model's to take)."""
    joined = {}
    for key in rests[0]:
        try:
            joined[key] = torch.cat([torch.as_tensor(rest[key]) for rest in rests])
        except (KeyError, TypeError, RuntimeError):
            continue
    return joined


#: What integer inputs that are not images can be, and what each needs.
INTEGER_ADVICE = (
    "numeric features such as counts: pass x.float(), with bounds= in their units (e.g. (0, inf) for counts); "
    "token ids: give embedding= (the model's embedding module: 'auto' for a Hugging Face model, or its dotted "
    "name, e.g. embedding='bert.embeddings.word_embeddings'), so that every check perturbs the embedding's output; "
    "or, for tsrm, a perturbation of your own that takes and returns token ids, a callable (x, generator) -> x' "
    "such as a random token substitution")


def _collate(items: list):
    """A batch of Dataset items as torch's default collate makes it, with list values (a Hugging Face
    dataset not set to torch format: ``input_ids`` as a list of ids) read as tensors first, so that
    a list is one input, not one value per position."""
    def tensors(item):
        if isinstance(item, Mapping):
            return {k: _as_tensor_if_list(v) for k, v in item.items()}
        if isinstance(item, (tuple, list)) and len(item) == 2:  # (input, label), a list too
            return tuple(_as_tensor_if_list(v) for v in item)
        return item

    return torch.utils.data.default_collate([tensors(item) for item in items])


def _as_tensor_if_list(value):
    if not isinstance(value, list):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return value  # text or ragged: left for the containers' errors


def _check_aligned(x, y) -> None:
    """pandas inputs and labels are read by position: refuse two whose index differ (a Series
    shuffled or filtered apart from its DataFrame), naming the fix."""
    index_x, index_y = getattr(x, "index", None), getattr(y, "index", None)
    if hasattr(index_x, "equals") and hasattr(index_y, "equals") and not index_x.equals(index_y):
        raise RobustDataError(
            "the inputs' and the labels' index differ (first rows: "
            f"{list(index_x[:3])} and {list(index_y[:3])}): pytest-robust reads both by position, so align them, "
            "e.g. y = y.loc[X.index], or reset both with .reset_index(drop=True)")


def _check_all_read(dataset, read: int) -> None:
    """A map-style dataset that yielded fewer items than its ``__len__`` (its ``__getitem__``
    raised StopIteration, which ends a loader silently) is refused, naming both counts."""
    length = _length(dataset)
    if length is not None and read < length:
        stop = _first_failure(dataset, read, length, StopIteration)[0]
        stop = read if stop is None else stop
        raise RobustDataError(f"the dataset's __len__ is {length}, but reading it in order yielded {stop} items (its "
                              f"__getitem__ raised StopIteration at item {stop}, which ends a loader): make __len__ "
                              "return the number of items the dataset holds")


def _length(dataset) -> int | None:
    """``len(dataset)`` of a map-style dataset; None for an iterable one or one without a length."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    try:
        return len(dataset)
    except TypeError:
        return None


def _first_failure(dataset, start: int, length: int, errors) -> tuple:
    """(index, error) of the first item in [start, length) whose reading raises one of ``errors``;
    (None, None) when every one reads."""
    for index in range(start, length):
        try:
            dataset[index]
        except errors as err:
            return index, err
    return None, None


def check_continuous(x: torch.Tensor) -> None:
    """Integer inputs where the check and its perturbation need continuous ones: a RobustDataError
    with the fix in the inputs' terms (images, counts, token ids)."""
    if not x.dtype.is_floating_point:
        raise RobustDataError(f"inputs must be floating point for this check and perturbation (got {x.dtype}): " + (
            "convert images with torchvision's ToTensor() or x.float() / 255 so that eps is in [0, 1] pixel units"
            if is_image_batch(x) else INTEGER_ADVICE))


def _unreadable(dataset, read: int, error: Exception) -> str:
    """What to say when reading a dataset's items failed after ``read`` items: for a map-style
    dataset, the first index of ``range(len(dataset))`` that cannot be read (a ``__len__`` larger
    than the items it holds)."""
    length = _length(dataset)
    index, failed = (None, None) if length is None else _first_failure(dataset, read, length, (IndexError, KeyError))
    if index is None:
        return f"reading the data failed after {read} items: {type(error).__name__}: {error}"
    return (f"the dataset's __len__ is {length}, but item {index} cannot be read ({type(failed).__name__}: "
            f"{failed}): make __len__ return the number of items the dataset holds (items 0..{length - 1} are read)")


def _checked(x: torch.Tensor, y: torch.Tensor, discrete: bool = False, extras: Extras | None = None) -> TensorData:
    """The data as ``TensorData`` once its shapes, dtypes and values make sense (``load_data``)."""
    _check_rows(x, y)
    _check_label_shape(x, y)
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
        whole = y.dtype.is_floating_point and bool((y == y.round()).all()) and bool((y >= 0).all())
        raise RobustDataError(f"labels must be integer class indices, got dtype {y.dtype}"
                              + (": they hold whole numbers, pass y.long()" if whole else ""))
    if not discrete:
        check_continuous(x)
    if (y < 0).any():
        raise RobustDataError(f"labels must be >= 0, got minimum {int(y.min())}")
    if x.dtype.is_floating_point or x.is_complex():
        check_finite(x)
    return TensorData(x, y.long(), extras)


def _check_rows(x: torch.Tensor, y: torch.Tensor) -> None:
    """x holds one row per input, at least one, and is not a single input with one label."""
    if x.ndim == 0:
        raise RobustDataError("x must hold one row per input, (n, ...), got a single number (a 0-d tensor)")
    if len(x) == 0:
        raise RobustDataError("the data is empty: x has no rows")
    if y.numel() == 1 and len(x) != 1 and x.ndim >= 1:  # one label for what reads as several inputs
        kind = "image" if x.ndim == 3 else "input"
        raise RobustDataError(
            f"the data is a single {kind} of shape {tuple(x.shape)} with one label (shape {tuple(y.shape)}), which "
            f"would be read as {len(x)} inputs of shape {tuple(x.shape[1:])}: add the batch dimension "
            "(x.unsqueeze(0), y.view(1)), or pass the whole dataset"
        )


def _check_label_shape(x: torch.Tensor, y: torch.Tensor) -> None:
    """Labels are one class index per input, shape (n,): one-hot, multi-hot and (n, 1) labels are
    named with their fix."""
    if y.ndim == 2 and len(y) == len(x) and y.shape[1] > 1 and bool(((y == 0) | (y == 1)).all()):
        one_hot = bool((y.sum(dim=1) == 1).all())
        raise RobustDataError(
            f"labels of shape {tuple(y.shape)} are " + (
                "one-hot rows: pass the class indices, y.argmax(dim=1)" if one_hot else
                "multi-hot rows (several classes per input): multi-label classification is not supported; each "
                "input needs one class index (a binary classifier per label can be checked on its own: "
                "y[:, k] as labels and that label's logit, logits=lambda out: out[:, k])")
        )
    if y.ndim == 2 and y.shape == (len(x), 1):
        raise RobustDataError(f"labels must have shape (n,), got {tuple(y.shape)}: pass y.view(-1)")
    if y.ndim != 1 or len(y) != len(x):
        raise RobustDataError(
            f"labels must have shape (n,) with n = len(x) = {len(x)}, got {tuple(y.shape)}"
            + (" (a 0-d label: y.view(1))" if y.ndim == 0 else "")
        )


#: Share of the device's free memory the data may take to be moved there whole.
DEVICE_SHARE = 0.25


def place(ds: TensorData, device: torch.device) -> TensorData:
    """The data on ``device``, moved once per check. On CUDA, inputs larger than ``DEVICE_SHARE``
    of the free memory stay on the host in pinned memory (blocks are then copied without
    blocking); labels always move."""
    if device.type != "cuda":
        return TensorData(ds.x.to(device), ds.y.to(device))
    free, _ = torch.cuda.mem_get_info(device)
    fits = ds.x.element_size() * ds.x.numel() <= DEVICE_SHARE * free
    x = ds.x.to(device, non_blocking=True) if fits else ds.x.pin_memory()
    return TensorData(x, ds.y.to(device, non_blocking=True))
