# Set-up and everyday commands. `make demo` and `make test` each create the virtual environment
# (.venv) if it is missing and install everything into it, pinned by .ci/constraints.txt.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := .ci/constraints.txt
REPORTS ?= reports

.PHONY: install demo demo-full test docs bench train clean

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e '.[test]'
	touch $@

## install: create .venv and install the package with its test and example dependencies
install: $(BIN)/.installed

DEMO = $(BIN)/python -m pytest examples/digits examples/tabular examples/text -rxs -p no:cacheprovider --junitxml=$(REPORTS)/demo-junit.xml \
	--robust-report $(REPORTS)/robust --robust-junitxml $(REPORTS)/robust-junit.xml --robust-per-input csv

## demo: the example robustness suites: the digits models (images, every check), a breast-cancer MLP
## (tabular features: noise and attacks in the features' own units) and a sentiment model on token
## ids (substitutions, and noise, an attack and a certificate on its embedding), about a minute on 2 cores;
## JUnit XML in reports/, report directory (summary, per-input CSV, plots, galleries) in reports/robust;
## ROBUST_ARGS="..." adds pytest-robust options (CI: --robust-compare main, --robust-save main)
demo: $(BIN)/.installed
	$(DEMO) -m "not slow_demo" $(ROBUST_ARGS)

## demo-full: the demo plus its slower examples (marked slow_demo: more NPPR fits, the pA report, ...)
demo-full: $(BIN)/.installed
	$(DEMO)

## test: the linter (ruff: pyflakes, pycodestyle, import order, 120 columns; pyproject.toml), the
## project's test suite (CPU; CUDA tests skip without a GPU), then the number snapshot again with
## torch's kernels forced to the baseline instruction set (other rounding, same numbers within the
## tolerances of tests/test_numbers.py)
test: $(BIN)/.installed
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest tests -p no:cacheprovider
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest tests/test_numbers.py -p no:cacheprovider -q

## docs: the documentation site in site/ (MkDocs, mkdocs.yml); --strict: a broken link, a missing page or a
## page left out of the navigation fails the build. Installs the docs extra if the environment lacks it.
docs: $(BIN)/.installed
	$(BIN)/python -m pip show --quiet mkdocs mkdocs-material mkdocstrings-python >/dev/null 2>&1 \
		|| $(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict -d site

## bench: every benchmark (tables in benchmarks/results/; figures copied into docs/). bench_corruptions.py
## needs the reference: $(BIN)/python -m pip install imagecorruptions scikit-image opencv-python-headless
bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_tsrm.py
	$(BIN)/python benchmarks/bench_smoothing.py --threads 1
	$(BIN)/python benchmarks/bench_q.py --threads 1
	$(BIN)/python benchmarks/bench_nppr.py --threads 1
	$(BIN)/python benchmarks/bench_corruptions.py --threads 2 | tee benchmarks/results/corruptions_cpu.txt
	$(BIN)/python benchmarks/bench_syncs.py --threads 1 | tee benchmarks/results/syncs_cpu.txt
	$(BIN)/python benchmarks/bench_overhead.py --threads 1 --steps 256 --runs 5 | tee benchmarks/results/overhead_cpu.txt
	$(BIN)/python -m pip install --quiet --no-deps torchattacks==3.5.1
	$(BIN)/python benchmarks/bench_adversarial.py --threads 2 | tee benchmarks/results/adversarial_cpu.txt
	$(BIN)/python benchmarks/bench_paired.py --threads 1 --seeds 5 | tee benchmarks/results/paired_cpu.txt
	$(BIN)/python benchmarks/bench_memory.py --threads 1 | tee benchmarks/results/memory_cpu.txt

## train: retrain the digits checkpoints shipped in examples/digits/checkpoints (seeded)
train: $(BIN)/.installed
	cd examples/digits && ../../$(BIN)/python train.py && ../../$(BIN)/python train_smoothing.py \
		&& ../../$(BIN)/python train_pgd.py

clean:
	rm -rf $(VENV) $(REPORTS) site *.egg-info
