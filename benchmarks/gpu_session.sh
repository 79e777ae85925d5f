#!/usr/bin/env bash
# The device checks of a session with a lent GPU, as one call (about 7 minutes on an H100):
# bench_syncs, bench_overhead, gpu_smoke, batch_size="auto"'s probe and corruption draws per second beside the bare
# model on CUDA, then the test suite with CUDA present. Outputs go to $OUT
# (the device tool's folder; ./gpu-out elsewhere). Where junit-xml is missing, carry its wheel in
# .whl/ (pip download --no-deps junit-xml==1.9 -d .whl). Tests that need the docs tool chain or
# check-jsonschema are left out.
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
timeout 100 python3 benchmarks/bench_syncs.py --device cuda > "$OUT/syncs.txt" 2>&1
timeout 90 python3 benchmarks/bench_overhead.py --device cuda --steps 256 --runs 3 > "$OUT/overhead.txt" 2>&1
timeout 300 python3 benchmarks/gpu_smoke.py --device cuda > "$OUT/smoke.txt" 2>&1
timeout 90 python3 - > "$OUT/batch_auto.txt" 2>&1 <<'PY'
import torch, torchvision, pytest_robust as pr
for side in (32, 224):  # batch_size="auto" on a ResNet-18: the probe's sizes, throughputs and choice
    model = torchvision.models.resnet18(num_classes=10).eval()
    x, y = torch.rand(512, 3, side, side), torch.randint(0, 10, (512,))
    r = pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.03), budget=4096, device="cuda")
    print(side, "px:", r.details["batch_size_probe"], "| batch size at the end:", r.details["batch_size"])
PY
timeout 120 python3 - > "$OUT/corruptions.txt" 2>&1 <<'PY'
import time, torch, torchvision, pytest_robust as pr
def rate(fn, n, runs=5):  # images per second: median of timed runs after a warm-up, device synchronised
    fn(); torch.cuda.synchronize(); times = []
    for _ in range(runs):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    return n / sorted(times)[runs // 2]
for side, batch in ((32, 512), (224, 64)):  # corruption draws per second beside the bare ResNet-18 forward pass
    x = torch.rand(batch, 3, side, side, device="cuda")
    model = torchvision.models.resnet18(num_classes=10).eval().cuda()
    with torch.inference_mode():
        print(f"{side} px, batch {batch}: bare ResNet-18 forward {rate(lambda: model(x), batch):,.0f} img/s")
    for name in pr.corruption_names():
        c, g = pr.Corruption(name, 3), torch.Generator("cuda").manual_seed(0)
        if min(x.shape[-2:]) >= 32 or name not in ("glass_blur", "motion_blur", "snow", "frost", "spatter"):
            print(f"{side} px | {name} | {rate(lambda: c.draw(x, g, None, None), batch):,.0f} img/s")
PY
timeout 150 python3 -m pytest -n 14 -q -p no:cacheprovider --tb=long -rfE tests \
  --ignore=tests/test_docs_site.py --ignore=tests/test_docs_code_blocks.py --ignore=tests/test_docs_byom.py \
  --ignore=tests/test_model_families.py > "$OUT/tests.txt" 2>&1
grep -v "^W[0-9]" "$OUT/syncs.txt" | tail -16
grep "^|" "$OUT/overhead.txt"
grep "px:" "$OUT/batch_auto.txt"
grep "img/s" "$OUT/corruptions.txt"
grep "^FAILED\|^ERROR\|passed\|failed" "$OUT/tests.txt" | tail -30
