"""Settings: one table of keys, resolved with one precedence (``PRECEDENCE``): marker or per-check key >
command line > a suite's settings: or --robust-config > ini > default.

Every key is spelled the same way everywhere: ``--robust-batch-size`` on the command line,
``robust_batch_size`` in ini (``[tool.pytest.ini_options]``), ``batch_size:`` in the YAML file
named by ``--robust-config`` / ``robust_config``, and ``batch_size=`` on a ``robust`` marker.
Pure Python (no pytest, no torch): errors are ``SettingError`` naming the key, where it came from
and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from pytest_robust.errors import SettingError
from pytest_robust.settings import interface_values, validation


@dataclass(frozen=True)
class Settings:
    """Resolved settings of a session (or of one check, after its marker's overrides)."""

    device: str = "auto"
    seed: int = 0
    confidence: float = 0.95
    batch_size: int | str = "auto"  # engine.batching: probed on CUDA, 1024 elsewhere
    budget: int | None = None  # None: each metric's own default (registry.Metric.budget)
    time_limit: float | None = None  # seconds per check; None: no limit
    inconclusive: str = "fail"
    model: str = "robust_model"
    data: str = "robust_data"
    eps: float = 8 / 255
    report: str | None = None
    cache_dir: str = ".robust_cache"
    refit: bool = False
    profile: str | None = None
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    deterministic: bool = False
    normalize: tuple | None = None  # ((mean, ...), (std, ...)): applied inside the model call
    logits: object = None  # which part of the model's output holds the logits (key, index, callable)
    data_keys: tuple | None = None  # (input key, label key) of mapping data items
    embedding: object = None  # the model's embedding module (a dotted name, "auto" or the module): token ids

    def replace(self, values: dict, source: str) -> "Settings":
        """A copy with ``values`` (raw, validated here) applied; ``source`` names their origin."""
        return Settings(**{**self.__dict__, **parse_layer(values, source)})


def data_key_pair(key: str, value) -> tuple[str, str] | None:
    """``data_keys``: (input key, label key), two different non-empty names, as a pair or as the
    text "image,label" (ini, command line); None, or the text "none", for the common names."""
    accepted = ("a pair of two different non-empty names (input_key, label_key), e.g. ('img', 'klass'), or the "
                "text 'img,klass'")
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return None
    parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else value
    if not (isinstance(parts, (list, tuple)) and len(parts) == 2
            and all(isinstance(p, str) and p.strip() for p in parts) and parts[0] != parts[1]):
        raise SettingError(key, value, accepted)
    return tuple(parts)


@dataclass(frozen=True)
class Key:
    """A setting's name, validator and help text (its default is the ``Settings`` field's)."""

    name: str
    parse: object
    help: str
    flag: bool = False  # a command-line switch without a value (--robust-refit)

    @property
    def default(self):
        return getattr(Settings(), self.name)


KEYS = (
    Key("device", validation.device,
        "device for robustness checks: auto (CUDA when present, else CPU), cpu, cuda, cuda:N, mps; "
        "asking for cuda where none exists is a usage error"),
    Key("seed", validation.non_negative_int,
        "seed of every check's random streams (a rerun with the same seed repeats the numbers)"),
    Key("confidence", validation.open_unit,
        "confidence of each check's verdict and bounds; each check has error probability "
        "<= 1 - confidence on its own"),
    Key("batch_size", validation.batch_size_value,
        "inputs per forward pass, or auto: on CUDA the largest batch that still raises throughput (probed once "
        "per check on its clean inputs), elsewhere 1024; halved automatically on out-of-memory"),
    Key("budget", validation.positive_int,
        "cap on model evaluations per check (one input through the model, with or without a "
        "backward pass); a check undecided at the cap is inconclusive; default: each metric's own "
        "(docs/settings.md, 'Budgets')"),
    Key("time_limit", validation.positive_float,
        "seconds each check may run; when they pass, the check stops between steps and ends inconclusive "
        "with the evidence it gathered (estimate, bounds, evaluations) unless that already decides; "
        "default: no limit"),
    Key("inconclusive", validation.choice("fail", "skip"),
        "what an inconclusive check does to its test: fail or skip"),
    Key("model", validation.identifier, "name of the fixture that returns the model"),
    Key("data", validation.identifier, "name of the fixture that returns the data"),
    Key("eps", validation.positive_float,
        "radius of the default perturbation UniformLinf(eps) for checks given none "
        "(in the units of your inputs; 8/255 = 8 grey levels in [0, 1] pixel space)"),
    Key("report", validation.path,
        "directory for report files (results.json, plots of curves); written once, on the controller"),
    Key("cache_dir", validation.path,
        "directory for fitted artefacts reused across runs (e.g. NPPR's learned perturbation models), "
        "relative to the working directory"),
    Key("refit", validation.boolean,
        "ignore cached fitted artefacts and fit again", flag=True),
    Key("profile", validation.name,
        "profile of YAML suites (robust_*.yaml) to run, e.g. smoke, ci or nightly; scales budgets"),
    Key("precision", validation.choice(*validation.PRECISION_CHOICES),
        "precision the model runs in: fp32 (its own dtype), bf16 or fp16 (torch.autocast), auto (bf16 on "
        "CUDA devices that support it, else fp32); perturbations and statistics stay in float32"),
    Key("channels_last", validation.boolean,
        "run 4-D image inputs and the model's 4-D weights in channels-last layout", flag=True),
    Key("compile", validation.boolean,
        "wrap the model with torch.compile for each check (pays a compilation per check; where a compiled call "
        "fails, the model runs as it is, with a warning)", flag=True),
    Key("deterministic", validation.boolean,
        "deterministic kernels and no TF32 (bit-exact repeats on CUDA; the CPU is deterministic anyway)",
        flag=True),
    Key("normalize", interface_values.normalization,
        "the model's input normalization (mean, std), applied inside the model call so that data, eps, "
        "sigma, radius and box stay in [0, 1] pixel units: imagenet, or '[[0.485, 0.456, 0.406], "
        "[0.229, 0.224, 0.225]]' (per channel) or '(0.5, 0.25)'"),
    Key("logits", interface_values.logits_selector,
        "which part of the model's output holds the logits when it is not a tensor, an object with "
        ".logits or a mapping with a 'logits' key: a key or attribute name, or an index (0)"),
    Key("data_keys", data_key_pair,
        "the keys of mapping data items that hold the input and the label, as input_key,label_key (e.g. "
        "img,klass); default: the common names (image, pixel_values, input, inputs, x; label, labels, "
        "target, targets, y)"),
    Key("embedding", interface_values.embedding,
        "the model's embedding module, for token-id inputs: the checks perturb its output, in the embedding's "
        "units: auto (a Hugging Face model's get_input_embeddings()), or its dotted name (e.g. "
        "bert.embeddings.word_embeddings); default: none (inputs as they are)"),
)
KEY_NAMES = tuple(k.name for k in KEYS)
assert KEY_NAMES == tuple(f.name for f in fields(Settings)), "KEYS and Settings must list the same keys"
#: Keys that hold for a whole run, never for one check: where each is set instead.
PER_RUN = {
    "profile": "is chosen per run with --robust-profile (or robust_profile in ini)",
    "report": "is one directory per session: use --robust-report or robust_report in ini",
}
#: The keys one check may override (a marker, a YAML check, a fixture call).
CHECK_KEY_NAMES = tuple(k for k in KEY_NAMES if k not in PER_RUN)


def parse_layer(values: dict, source: str) -> dict:
    """Validate one layer of raw values (None means unset); errors name the key and ``source``
    (in which "<key>" and "<flag>" stand for the key's name, with dashes for the flag)."""
    by_name = {k.name: k for k in KEYS}
    parsed = {}
    for name, value in values.items():
        if value is None:
            continue
        if name not in by_name:
            raise SettingError(
                f"{name} ({source})", value, "one of the keys " + ", ".join(KEY_NAMES)
            )
        try:
            parsed[name] = by_name[name].parse(name, value)
        except SettingError as err:
            where = source.replace("<key>", name).replace("<flag>", name.replace("_", "-"))
            raise SettingError(f"{name} ({where})", value, err.accepted, name=name) from None
    return parsed


def read_yaml(path: str | Path) -> dict:
    """Read a settings YAML file: a mapping of keys from ``KEYS``."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise SettingError("config", str(path), f"a readable YAML file ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise SettingError("config", str(path), f"valid YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingError("config", str(path), "a YAML mapping of setting keys to values")
    return data


#: Where a setting can come from, the strongest first: the one precedence of every setting, in
#: markers, fixture calls, YAML suites and library calls alike (docs/settings.md shows this table).
PRECEDENCE = (
    ("a robust marker's keyword, a robust fixture call's keyword, a suite check's own key", "this check"),
    ("the command line (--robust-budget 300)", "the run"),
    ("a suite's settings: and its selected profile's keys; the --robust-config file", "a suite; the run"),
    ("ini (robust_budget in [tool.pytest.ini_options])", "the project"),
    ("the defaults", "everywhere"),
)
COMMAND_LINE_SOURCE = "command line --robust-<flag>"


def resolve(*, ini: dict, yaml_values: dict, yaml_source: str, cli: dict) -> Settings:
    """Session settings from defaults < ini < --robust-config < command line (``PRECEDENCE``; a
    suite's settings slot in below the command line, ``suites.schema.load_suite``; markers and
    per-check keys apply per test, above everything)."""
    return (
        Settings()
        .replace(ini, "ini option robust_<key>")
        .replace(yaml_values, yaml_source)
        .replace(cli, COMMAND_LINE_SOURCE)
    )
