"""Stable accuracy: the share of inputs classified correctly under every one of k noisy copies (a
per-input statistic, bounded over inputs by the per-input procedure)."""


from pytest_robust import Metric, Param
from pytest_robust.engine.ranking import correct_predictions
from pytest_robust.procedures import per_input
from pytest_robust.settings.validation import positive_float, positive_int


def evaluate(run, sigma: float, copies: int):
    run.require(len(run.ds) * copies, f"to evaluate {copies} noisy copies of each of the {len(run.ds)} inputs")

    def statistic(x, y, streams):
        noise = streams.randn(copies, *x.shape[1:]).transpose(0, 1).reshape(-1, *x.shape[1:])  # copy-major
        noisy = x.repeat(copies, *[1] * (x.dim() - 1)) + sigma * noise
        hits = correct_predictions(run.forward.logits(noisy.clamp(0, 1)), y.repeat(copies))
        return {"stable": hits.view(copies, len(y)).all(0)}

    stable = per_input.over_blocks(run, run.ds.x, run.ds.y, 16, "stable", statistic)["stable"]
    return per_input.rate_result(run, stable, f"{copies} copies of GaussianNoise(sigma={sigma:g})")


STABLE_ACCURACY = Metric(evaluate, title="stable accuracy", budget=50_000, params=(
    Param("sigma", positive_float, 0.1, "standard deviation of the noise, in input units"),
    Param("copies", positive_int, 8, "noisy copies of each input; all must be classified correctly")),
    doc="share of inputs correct under every noisy copy >= threshold")
