"""NPPR benchmark on the digits example: learned worst-case PR against random noise and PGD.

Run from the repository root:

    python benchmarks/bench_nppr.py [--quick] [--device cpu|cuda] [--threads N] [--covariance full|diagonal]

For each digits model (standard, noise-trained), each eps in {0.1, 0.2, 0.3} (quick: 0.2 only) and
each dependency structure (independent, label, input, joint), one ``nppr`` call in estimate-only
mode (no threshold: exactly ``budget`` draws from the frozen learned mixture) fits the mixture on
the 1438 training digits (``fit_data``) and evaluates on the 359 held-out test digits. It reports
the learned distribution's PR (NPPR estimate, with 95% anytime-valid bounds), PR under Gaussian
N(0, eps^2) and uniform L-inf noise at the same eps, the PGD robust accuracy (50 steps, one random
start), and the wall seconds of the fit and of the evaluation (everything else in the call).
The expected ordering is PGD accuracy <= NPPR <= min(Gaussian PR, uniform PR); the ``order``
column says whether the point estimates satisfy it. No cache is used: every fit is timed.
"""

from __future__ import annotations

import sys

# importing common first puts the repository root and examples/digits on sys.path
from common import digits, header, load, load_average, markdown_table, parse_args, report, timed

from pytest_robust.checks.nppr.check import nppr
from pytest_robust.checks.nppr.gmm import DEPENDENCIES

SEED = 0
MODELS = ("standard", "noise")
#: Settings of a full run and of a --quick run.
FULL = dict(eps=(0.1, 0.2, 0.3), budget=5_000, fit_steps=None)
QUICK = dict(eps=(0.2,), budget=2_000, fit_steps=100)


def run(model, train, test, eps: float, dependency: str, cfg: dict, device) -> dict:
    """One estimate-only nppr call (default settings unless cfg overrides them); numbers and timings."""
    options = {k: cfg[k] for k in ("fit_steps", "covariance") if cfg[k] is not None}
    r, total = timed(lambda: nppr(model, test, eps=eps, dependency=dependency, fit_data=train, budget=cfg["budget"],
                                  pgd=True, seed=SEED, device=device, **options))
    ctx = r.details["context"]
    return {
        "nppr": r.estimate, "lower": r.lower, "upper": r.upper,
        "gaussian": ctx["gaussian_pr"], "uniform": ctx["uniform_pr"], "pgd": ctx["pgd_accuracy"],
        "per_input_90": r.details["per_input"]["fraction_pr_at_least_0.9"],
        "fit_s": r.details["fit"]["seconds"], "eval_s": total - r.details["fit"]["seconds"],
        "steps": r.details["fit"]["steps"], "mixture": r.details["mixture"],
    }


def table(cfg: dict, device) -> str:
    train, test = digits()
    load_avg = load_average()
    rows = []
    for name in MODELS:
        model = load(name, device)
        for eps in cfg["eps"]:
            for dependency in DEPENDENCIES:
                rows.append((name, eps, dependency, run(model, train, test, eps, dependency, cfg, device)))
                print(f"  done: {name} eps={eps} {dependency}", file=sys.stderr, flush=True)
    m = rows[0][3]["mixture"]
    line = header(
        device,
        f"seed={SEED}",
        f"mixture K={m['components']}, latent={m['latent_dim']}, covariance={m['covariance']}, grid={m['grid_size']}",
        f"fit {rows[0][3]['steps']} steps on the 1438 training digits",
        f"evaluation on the 359 test digits, {cfg['budget']:,} draws from the learned mixture, "
        f"the same number (at least 4096) of Gaussian and uniform draws, 32 per input for per-input PR",
        load_avg=load_avg,
    )
    columns = ["model", "eps", "dependency", "NPPR [95% bounds]", "Gaussian PR", "uniform PR", "PGD acc", "order",
               "inputs PR>=0.9", "fit s", "eval s"]
    cells = []
    for name, eps, dependency, r in rows:
        ordered = r["pgd"] <= r["nppr"] <= min(r["gaussian"], r["uniform"])
        cells.append([
            name, f"{eps:g}", dependency, f"{r['nppr']:.3f} [{r['lower']:.3f}, {r['upper']:.3f}]",
            f"{r['gaussian']:.3f}", f"{r['uniform']:.3f}", f"{r['pgd']:.3f}", "yes" if ordered else "NO",
            f"{r['per_input_90']:.3f}", f"{r['fit_s']:.1f}", f"{r['eval_s']:.1f}",
        ])
    return line + "\n" + markdown_table(columns, cells, "lrllrrrlrrr")


def main(argv=None) -> None:
    args = parse_args(__doc__, quick="eps 0.2 only, shorter fits, fewer draws", argv=argv, extra={
        "--covariance": dict(choices=("full", "diagonal"), default=None,
                             help="mixture covariance (default: nppr's default, diagonal); full is much slower "
                             "with the input and joint heads"),
    })
    cfg = {**(QUICK if args.quick else FULL), "covariance": args.covariance}
    report(f"NPPR benchmark ({args.mode} run), digits example", lambda: table(cfg, args.device))


if __name__ == "__main__":
    main()
