"""One door (``Metric.accept``): every built-in check gives the same numbers through its four
doors, the library function, a marker, a ``robust`` fixture call and a YAML suite, with several
non-default parameters, ``eps`` among them. The session's ``--robust-eps`` differs from every
check's own ``eps``: a door that let the setting win would move the numbers."""

from __future__ import annotations

import json

import pytest
from toy_models import SmallNet, image_data, small_net_conftest

import pytest_robust as pr

N, SEED = 24, 3
#: metric -> (threshold keyword on a marker, threshold, parameters as Python source, as YAML, budget)
CASES = {
    "tsrm": ("tsrm", 0.5, "perturbation=UniformLinf(eps=0.2)", "perturbation: {UniformLinf: {eps: 0.2}}", 400),
    "corruption_accuracy": ("corruption_accuracy", 0.5, "corruptions=['gaussian_noise', 'contrast'], severities=[1, 3]",
                            "corruptions: [gaussian_noise, contrast]\n    severities: [1, 3]", 400),
    "q": ("max_loss", 2.0, "q=10, perturbation=UniformLinf(eps=0.3), steps=6, warmup=2, inputs=8, pgd_steps=2",
          "q: 10\n    perturbation: {UniformLinf: {eps: 0.3}}\n    steps: 6\n    warmup: 2\n    inputs: 8\n"
          "    pgd_steps: 2", 20_000),
    "certified_accuracy": ("certified_accuracy", 0.2, "radius=0.1, sigma=0.25, alpha=0.01, max_draws=200",
                           "radius: 0.1\n    sigma: 0.25\n    alpha: 0.01\n    max_draws: 200", 20_000),
    "nppr": ("nppr", 0.3, "eps=0.1, components=2, latent_dim=4, fit_steps=3, fit_batch_size=8, draws_per_input=2",
             "eps: 0.1\n    components: 2\n    latent_dim: 4\n    fit_steps: 3\n    fit_batch_size: 8\n"
             "    draws_per_input: 2", 20_000),
    "adversarial_accuracy": ("adversarial_accuracy", 0.2, "eps=0.05, steps=4, targets=1, square_queries=5",
                             "eps: 0.05\n    steps: 4\n    targets: 1\n    square_queries: 5", 20_000),
}
PUBLIC = {"q": "intermediate_q"}
NUMBERS = ("verdict", "estimate", "lower", "upper", "draws", "forward_passes")


def _library(metric: str) -> dict:
    key, threshold, source, _, budget = CASES[metric]
    params = eval(f"dict({source})", {"UniformLinf": pr.UniformLinf})
    call = getattr(pr, PUBLIC.get(metric, metric))
    threshold_key = "max_loss" if metric == "q" else "threshold"
    result = call(SmallNet().eval(), image_data(n=N), **{threshold_key: threshold}, **params, seed=SEED,
                  budget=budget, refit=True) if metric == "nppr" else \
        call(SmallNet().eval(), image_data(n=N), **{threshold_key: threshold}, **params, seed=SEED, budget=budget)
    return {k: getattr(result, k) for k in NUMBERS}


def _marker(metric: str) -> str:
    key, threshold, source, _, budget = CASES[metric]
    head = f"q=10, max_loss={threshold}" if metric == "q" else f"{key}={threshold}"
    source = source.replace("q=10, ", "") if metric == "q" else source
    return (f"@pytest.mark.robust({head}, {source}, seed={SEED}, budget={budget})\n"
            f"def test_marker_{metric}():\n    pass\n")


def _fixture(metric: str) -> str:
    key, threshold, source, _, budget = CASES[metric]
    threshold_key = "max_loss" if metric == "q" else "threshold"
    return (f"def test_fixture_{metric}(robust, robust_model, robust_data):\n"
            f"    robust.{metric}(robust_model, robust_data, {threshold_key}={threshold}, {source}, seed={SEED}, "
            f"budget={budget}, enforce=False)\n")


def _yaml(metric: str) -> str:
    key, threshold, _, yaml_params, budget = CASES[metric]
    head = f"q: 10\n    max_loss: {threshold}" if metric == "q" else f"{key}: {threshold}"
    yaml_params = yaml_params.replace("q: 10\n    ", "") if metric == "q" else yaml_params
    return f"  - name: yaml_{metric}\n    {head}\n    {yaml_params}\n    seed: {SEED}\n    budget: {budget}\n"


def test_every_check_gives_the_same_numbers_through_all_four_doors(pytester):
    pytester.makeconftest(small_net_conftest(N))
    pytester.makepyfile(factories=f"""
from toy_models import SmallNet, image_data

def model():
    return SmallNet().eval()

def data():
    return image_data(n={N})
""")
    pytester.makepyfile(test_four_doors="import pytest\nfrom pytest_robust import UniformLinf\n\n\n"
                        + "\n\n".join(_marker(m) + "\n\n" + _fixture(m) for m in CASES))
    pytester.path.joinpath("robust_doors.yaml").write_text(
        "model: factories:model\ndata: factories:data\nchecks:\n" + "".join(_yaml(m) for m in CASES))
    run = pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out", "--robust-eps", "0.3",
                             "--robust-refit")
    assert (pytester.path / "out" / "results.json").exists(), run.stdout.str() + run.stderr.str()
    results = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    by_door = {}
    for r in results:
        door = next(d for d in ("marker", "fixture", "yaml") if d in r["test_id"])
        by_door[(door, r["metric"])] = {k: r[k] for k in NUMBERS}
    for metric in CASES:
        library = _library(metric)
        doors = {door: by_door.get((door, metric)) for door in ("marker", "fixture", "yaml")}
        for door, got in doors.items():
            assert got is not None, f"{metric}: no result through the {door}"
            assert got["verdict"] == library["verdict"], (metric, door, got, library)
            for k in NUMBERS[1:]:
                assert got[k] == pytest.approx(library[k], rel=1e-9, abs=1e-12), (metric, door, k, got, library)


#: analysis -> its keywords in a call (as Python source): the analyses have two doors, the library
#: function and the fixture, and go through the same one (``Metric.accept``) as the checks.
ANALYSES = {
    "q_curve": "perturbation=UniformLinf(eps=0.2), qs=(1, 10), steps=6, warmup=2, inputs=8, pgd_steps=2, budget=20_000",
    "certify": "0.25, n0=10, n=60, alpha=0.01",
    "predict": "0.25, n=60, alpha=0.01",
    "pa_report": "0.25, n=60, radii=[0.0, 0.1]",
}


def test_every_analysis_gives_the_same_numbers_through_the_library_and_the_fixture(pytester):
    pytester.makeconftest(small_net_conftest(N))
    pytester.makepyfile(test_analyses="import pytest\nfrom pytest_robust import UniformLinf\n\n\n" + "\n\n".join(
        f"def test_fixture_{name}(robust, robust_model, robust_data):\n"
        f"    robust.{name}(robust_model, robust_data, {source}, seed={SEED})\n" for name, source in ANALYSES.items()))
    run = pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out")
    assert (pytester.path / "out" / "results.json").exists(), run.stdout.str() + run.stderr.str()
    results = {r["metric"]: r for r in json.loads((pytester.path / "out" / "results.json").read_text())["results"]}
    for name, source in ANALYSES.items():
        value = eval(f"pr.{name}(SmallNet().eval(), image_data(n={N}), {source}, seed={SEED})",
                     {"pr": pr, "SmallNet": SmallNet, "image_data": image_data, "UniformLinf": pr.UniformLinf})
        library = value if isinstance(value, pr.Result) else value.to_result()
        got = results[name]
        assert got["verdict"] == library.verdict == "estimate", name
        for k in NUMBERS[1:]:
            assert got[k] == pytest.approx(getattr(library, k), rel=1e-9, abs=1e-12), (name, k)


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_a_misspelt_keyword_of_an_analysis_gets_the_doors_message_in_the_library_and_the_fixture(pytester, name):
    with pytest.raises(pr.ArgumentError) as err:
        getattr(pr, name)(SmallNet().eval(), image_data(n=4), sede=3)
    library = str(err.value)
    assert library.startswith(f"unknown keyword(s) sede (did you mean seed?) on {name}(...); valid keywords of "
                              f"{name}(...): ")
    pytester.makeconftest(small_net_conftest(4))
    pytester.makepyfile(test_misspelt=f"""
def test_it(robust, robust_model, robust_data):
    robust.{name}(robust_model, robust_data, sede=3)
""")
    run = pytester.runpytest("-p", "no:cacheprovider")
    run.stdout.fnmatch_lines([f"*unknown keyword(s) sede (did you mean seed?) on robust.{name}(...); valid keywords of "
                              f"robust.{name}(...): *"])


@pytest.mark.parametrize("key", ["report", "profile"])
def test_a_per_run_setting_on_a_marker_is_a_usage_error_naming_where_it_belongs(pytester, key):
    pytester.makeconftest(small_net_conftest(4))
    pytester.makepyfile(test_per_run=f"""
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.5, perturbation=UniformLinf(eps=0.1), {key}="somewhere")
def test_it():
    pass
""")
    run = pytester.runpytest("-p", "no:cacheprovider")
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    flag = "--robust-report" if key == "report" else "--robust-profile"
    run.stderr.fnmatch_lines([f"*{key}= on robust(tsrm=...): {key} * {flag}*, not per check*"])
