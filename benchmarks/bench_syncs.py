"""Host synchronisations per model batch in every hot loop, on the digits example.

Run from the repository root:

    python benchmarks/bench_syncs.py [--device cpu|cuda] [--threads N]

A host synchronisation makes the host wait for the device (``.item()``, ``bool(t)``, ``.cpu()``,
``nonzero``, mask indexing, a blocking copy). Each hot loop is run twice with the same settings
but more work (more draws, steps or inputs), and the table reports the *marginal* figure:

    (syncs of the larger run - syncs of the smaller run) / (model calls of the larger - smaller)

so that the one-off checks a check makes at its start (box, probe, first-batch inspection) do
not count. The counter is ``pytest_robust.engine.host_syncs.count_host_syncs``: on ``--device cuda`` CUDA's
own sync debug mode (every synchronising call, blocking uploads included); on the CPU a stand-in
that counts the host reads the code makes. The model's own forward passes are excluded. The goal
is at most 2 per model batch; "where" names the source lines that synced in the larger run.
"""

from __future__ import annotations

from common import digits, header, load, markdown_table, parse_args, report

from pytest_robust import (
    Spatial,
    UniformLinf,
    adversarial_accuracy,
    certified_accuracy,
    certify,
    corruption_accuracy,
    intermediate_q,
    nppr,
    predict,
    tsrm,
)
from pytest_robust.engine.host_syncs import count_host_syncs

BATCH = 256
GRID = dict(corruptions=["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur",
                         "zoom_blur", "brightness", "contrast", "pixelate", "jpeg_compression"],
            severities=[1, 3, 5])


def loops(data):
    """(hot loop, run(model, size)) pairs; ``size`` 1 is the smaller run, 2 the larger."""
    x, y = data
    box = UniformLinf(eps=0.1)
    few = (x[:32], y[:32])
    return [
        ("TSRM stream", lambda m, k: tsrm(m, data, perturbation=box, threshold=None, budget=2048 * k,
                                          batch_size=BATCH)),
        ("corruption grid", lambda m, k: corruption_accuracy(m, data, threshold=None, budget=2048 * k,
                                                             batch_size=BATCH, **GRID)),
        ("NPPR stream", lambda m, k: nppr(m, data, eps=0.1, latent_dim=8, components=2, fit_steps=4, fit_batch_size=32,
                                          fit_draws=2, draws_per_input=4, budget=20_000 * k, batch_size=BATCH)),
        ("NPPR fit step", lambda m, k: nppr(m, data, eps=0.1, latent_dim=8, components=2, fit_steps=8 * k,
                                            fit_batch_size=32, fit_draws=2, draws_per_input=4, budget=40_000,
                                            batch_size=BATCH)),
        ("certified-accuracy gate", lambda m, k: certified_accuracy(m, few, threshold=None, radius=0.1, sigma=0.25,
                                                                    max_draws=1024 * k, budget=200_000,
                                                                    batch_size=BATCH)),
        ("CERTIFY", lambda m, k: certify(m, few, 0.25, n0=64, n=512 * k, batch_size=BATCH)),
        ("PREDICT", lambda m, k: predict(m, few, 0.25, n=512 * k, batch_size=BATCH)),
        ("PGD step", lambda m, k: adversarial_accuracy(m, data, threshold=None, eps=0.1, steps=10 * k, restarts=1,
                                                       batch_size=BATCH)),
        ("HMC transition", lambda m, k: intermediate_q(m, few, perturbation=box, q=10, estimator="hmc", chains=4,
                                                       steps=8 * k, warmup=2, pgd_steps=2, budget=400_000,
                                                       batch_size=BATCH)),
        ("MH transition", lambda m, k: intermediate_q(m, few, perturbation=Spatial(rotation=10), q=10, estimator="mh",
                                                      chains=4, steps=8 * k, warmup=2, pgd_steps=2, budget=400_000,
                                                      batch_size=BATCH)),
        ("Monte Carlo block", lambda m, k: intermediate_q(m, few, perturbation=box, q=1, estimator="mc", chains=4,
                                                          steps=32 * k, pgd_steps=2, budget=400_000, batch_size=BATCH)),
    ]


def measure(model, run, device):
    """(calls, syncs, top lines) of the smaller and the larger run."""
    out = []
    for k in (1, 2):
        with count_host_syncs(model, device.type) as count:
            run(model, k)
        out.append(count)
    return out


def sync_table(model, data, device) -> str:
    rows = []
    for name, run in loops(data):
        small, large = measure(model, run, device)
        calls = large.calls - small.calls
        marginal = (large.syncs - small.syncs) / calls if calls > 0 else float("nan")
        where = ", ".join(f"{line} ({n})" for line, n in large.where.most_common(3))
        rows.append([name, f"{small.calls} -> {large.calls}", f"{small.syncs} -> {large.syncs}",
                     f"{marginal:.2f}", "yes" if marginal <= 2 else "NO", where])
    counter = "CUDA sync debug mode" if device.type == "cuda" else "CPU stand-in (host reads)"
    top = header(device, f"batch size {BATCH}", f"counter: {counter}", "digits standard CNN, 359 test digits")
    columns = ["hot loop", "model calls", "host syncs", "marginal syncs per call", "<= 2", "where (larger run)"]
    return "\n".join([top, "", markdown_table(columns, rows, "lrrrll")])


def main(argv=None) -> None:
    args = parse_args(__doc__, argv=argv)
    model = load("standard", args.device)
    data = digits()[1]
    report("Host synchronisations per model batch", lambda: sync_table(model, data, args.device))


if __name__ == "__main__":
    main()
