"""corruption_accuracy: exact values on a toy grid, gate calibration, agreement with TSRM, the
marker, the fixture, YAML suites and the report."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from pytest_robust import Corruption, corruption_accuracy, tsrm

# A grid whose mean accuracy is known exactly. Inputs: grey 8x8 images of value 0.5 (the CIFAR
# table applies). The model is right iff the image's mean is below 0.625. Brightness adds 0.05,
# 0.1, 0.15, 0.2, 0.3 (severities 1-5): right at 1 and 2 only; contrast keeps the mean: always
# right. Over brightness x 1-5 and contrast x 1-5 the accuracy is 7/10, exactly.
TOY = '''
import torch

class MeanBelow(torch.nn.Module):
    def __init__(self, t=0.625):
        super().__init__()
        self.t = t
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        d = (self.t - x.mean((1, 2, 3))) * self.w
        return torch.stack([d, -d], dim=1)

def grey_images(n=16):
    return torch.full((n, 1, 8, 8), 0.5), torch.zeros(n, dtype=torch.long)
'''
namespace: dict = {}
exec(TOY, namespace)
MeanBelow, grey_images = namespace["MeanBelow"], namespace["grey_images"]
GRID = dict(corruptions=["brightness", "contrast"], severities=[1, 2, 3, 4, 5])


def test_exact_breakdown_on_the_toy_grid():
    r = corruption_accuracy(MeanBelow(), grey_images(), budget=3016, seed=1, **GRID)
    d = r.details
    assert r.metric == "corruption_accuracy" and r.verdict == "estimate" and r.draws == 3000
    assert abs(r.estimate - 0.7) < 3 * math.sqrt(0.21 / 3000)
    assert d["clean_accuracy"] == 1.0 and d["relative_drop"] == pytest.approx(1 - r.estimate)
    assert [d["per_cell"][f"brightness/{s}"]["accuracy"] for s in range(1, 6)] == [1, 1, 0, 0, 0]
    assert all(d["per_cell"][f"contrast/{s}"]["accuracy"] == 1 for s in range(1, 6))
    assert d["per_corruption"]["contrast"]["accuracy"] == 1.0
    b = d["per_corruption"]["brightness"]
    assert b["cp_lower"] <= 0.4 <= b["cp_upper"] and b["draws"] + d["per_corruption"]["contrast"]["draws"] == 3000
    assert sum(v["draws"] for v in d["per_severity"].values()) == 3000
    five = d["per_severity"]["5"]  # half brightness (wrong), half contrast (right)
    assert d["per_severity"]["1"]["accuracy"] == 1.0 and five["cp_lower"] <= 0.5 <= five["cp_upper"]
    assert r.forward_passes == 3000 + 16 == r.budget  # the draws and one clean pass over the inputs
    assert r.details["evaluations"] == {"context": 16, "gate": 3000}
    assert d["heatmaps"]["corruption-accuracy"]["values"][0] == [1, 1, 0, 0, 0]
    assert "CorruptionGrid(corruptions=[brightness, contrast], severities=[1, 2, 3, 4, 5])" == r.perturbation


def test_same_numbers_for_any_batch_size():
    runs = [corruption_accuracy(MeanBelow(), grey_images(), budget=700, batch_size=b, seed=2, **GRID)
            for b in (64, 1024)]
    assert runs[0].estimate == runs[1].estimate and runs[0].details["per_cell"] == runs[1].details["per_cell"]


def test_calibration_false_pass_rate_at_the_threshold():
    """True accuracy 0.7 equal to the threshold: a pass (or a fail) is false and must happen in at
    most alpha of runs (+3 SE), as for TSRM."""
    reps, confidence = 120, 0.9
    alpha = 1 - confidence
    counts = {"pass": 0, "fail": 0, "inconclusive": 0}
    model, data = MeanBelow(), grey_images()
    for seed in range(reps):
        r = corruption_accuracy(model, data, threshold=0.7, confidence=confidence, budget=1024, seed=seed, **GRID)
        counts[r.verdict] += 1
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    assert counts["pass"] / reps <= bound and counts["fail"] / reps <= bound, counts
    # and away from the truth the gate decides the right way
    assert corruption_accuracy(model, data, threshold=0.5, budget=4000, **GRID).verdict == "pass"
    assert corruption_accuracy(model, data, threshold=0.9, budget=4000, **GRID).verdict == "fail"


def test_breakdown_agrees_with_separate_tsrm_checks():
    """Per-corruption accuracies of the grid against TSRM under each corruption alone (other draws):
    their Clopper-Pearson intervals overlap."""
    x = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0].mean((1, 2)) > x[:, 2].mean((1, 2))).long()  # more red than blue?
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].weight[1, 0], model[0].weight[1, 2] = 1.0, -1.0
        model[0].bias.zero_()
    names = ["gaussian_noise", "contrast", "saturate"]
    grid = corruption_accuracy(model, (x, y), corruptions=names, severities=[3, 5], budget=3000, seed=4)
    for name in names:
        part = grid.details["per_corruption"][name]
        alone = tsrm(model, (x, y), perturbation=_mixture(name), budget=1500, seed=9)
        assert part["cp_lower"] <= alone.details["cp_upper"] and alone.details["cp_lower"] <= part["cp_upper"], name


def _mixture(name):
    """Severity 3 or 5 with probability 1/2 each (the grid's mixture for one corruption)."""
    three, five = Corruption(name, 3), Corruption(name, 5)

    def corrupt(x, g):
        pick = torch.rand(len(x), generator=g) < 0.5
        return torch.where(pick[:, None, None, None], three(x, g), five(x, g))

    return corrupt


def test_corruption_code_reads_the_host_once_per_batch():
    """Host reads of device values per model batch made by the corruption code (host_syncs' CPU
    stand-in, which does not count reads of host memory such as the cells and seeds drawn from a
    host generator; marginal over two budgets, so setup does not count): none, and one when the
    grid holds JPEG, whose codec runs on the host; never one per cell or per image."""
    from pytest_robust.engine.host_syncs import count_host_syncs

    def reads(names, budget):
        model = MeanBelow()
        with count_host_syncs(model) as count:
            corruption_accuracy(model, grey_images(), corruptions=names, budget=budget, batch_size=256)
        return sum(n for where, n in count.where.items() if where.startswith("perturbations/corruptions")), count.calls

    for names, per_batch in ((["brightness", "contrast", "zoom_blur", "elastic_transform"], 0),
                             (["brightness", "jpeg_compression"], 1)):
        (reads_1, calls_1), (reads_2, calls_2) = reads(names, 16 + 512), reads(names, 16 + 1536)
        assert (reads_2 - reads_1) / (calls_2 - calls_1) == per_batch, names


def test_bad_grid_arguments_name_the_problem():
    with pytest.raises(ValueError, match="did you mean 'contrast'"):
        corruption_accuracy(MeanBelow(), grey_images(), corruptions=["contrst"])
    with pytest.raises(ValueError, match="severity must be an integer from 1 to 5"):
        corruption_accuracy(MeanBelow(), grey_images(), severities=[0, 1])
    with pytest.raises(ValueError, match="glass_blur cannot apply to 8x8 images"):
        corruption_accuracy(MeanBelow(), grey_images(), corruptions=["glass_blur"], budget=10)


# ---------------------------------------------------------------------------------------------
# marker, fixture, YAML suite, report
# ---------------------------------------------------------------------------------------------

CONFTEST = TOY + '''
import pytest

@pytest.fixture(scope="session")
def robust_model():
    return MeanBelow()

@pytest.fixture(scope="session")
def robust_data():
    return grey_images()
'''


def test_marker_fixture_yaml_and_report(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_grid=textwrap.dedent('''
        import pytest
        from pytest_robust import Corruption

        @pytest.mark.robust(corruption_accuracy=0.6, corruptions=["brightness", "contrast"], budget=4000)
        def test_marker_passes():
            pass

        @pytest.mark.robust(corruption_accuracy=0.8, corruptions=["brightness", "contrast"], budget=4000)
        def test_marker_fails():
            pass

        @pytest.mark.robust(tsrm=0.9, perturbation=Corruption("contrast", severity=2))
        def test_single_corruption():
            pass

        def test_fixture(robust, robust_model, robust_data):
            r = robust.corruption_accuracy(robust_model, robust_data, threshold=0.8, corruptions=["brightness"],
                                           severities=[1, 2, 3], budget=4000, enforce=False)
            assert r.verdict == "fail" and r.details["per_severity"]["3"]["accuracy"] == 0.0
    '''))
    pytester.makefile(".yaml", robust_grid=textwrap.dedent('''
        model: conftest:MeanBelow
        data: conftest:grey_images
        checks:
          - name: contrast-2
            tsrm: 0.9
            perturbation: {Corruption: {name: contrast, severity: 2}}
          - name: grid
            corruption_accuracy: 0.6
            corruptions: [brightness, contrast]
            severities: [1, 2]
          - name: typo
            tsrm: 0.9
            perturbation: {Corruption: {name: fgo, severity: 2}}
    '''))
    result = pytester.runpytest("-rf", "--robust-report", "out", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["robust_grid.yaml:13: checks[[]2].perturbation.Corruption: Corruption(name='fgo', "
                                 "severity=2): unknown corruption 'fgo' (did you mean 'fog'?)*"])
    pytester.path.joinpath("robust_grid.yaml").write_text(
        pytester.path.joinpath("robust_grid.yaml").read_text().split("  - name: typo")[0])
    result = pytester.runpytest("-rf", "--robust-report", "out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["corruption accuracy 0.* < required 0.8 under CorruptionGrid(corruptions="
                                 "[[]brightness, contrast], severities=[[]1, 2, 3, 4, 5]), * draws on 16 inputs, "
                                 "seed 0, * of 4000 model evaluations*"])
    summary = (pytester.path / "out" / "summary.md").read_text()
    assert "### Corruption accuracy of test_grid.py::test_marker_passes" in summary
    assert "| brightness | 1.000 | 1.000 | 0.000 | 0.000 | 0.000 |" in summary
    pytest.importorskip("matplotlib")
    assert any("corruption-accuracy" in p.name for p in (pytester.path / "out").glob("*.png"))
