# Two entry points do everything on a fresh machine:
#   make screen   set up, then screen the example config
#   make test     set up, then lint and run the test suite (what CI runs)
# Set-up is idempotent and fast once done: a stamp records the installed pyproject.toml.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch first, pinned: this CPU build lies on disk here; an unpinned torch would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
SCREEN ?= screens/gpt-small-noln.yaml

.PHONY: install screen test lint format clean bench-norms bench-sweep bench-dmd bench-scale bench-kss bench-faults bench-stability bench-known-spectrum calibration rescreen refit

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

screen: install
	$(BIN)/rksp screen $(SCREEN)

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info

bench-norms: install
	$(BIN)/python benchmarks/norm_table.py

bench-sweep: install
	$(BIN)/python benchmarks/sweep_throughput.py

bench-dmd: install
	$(BIN)/python -m pip install --quiet pydmd
	$(BIN)/python benchmarks/dmd_speed.py

bench-scale: install
	$(BIN)/python benchmarks/scale.py

bench-kss: install
	$(BIN)/python benchmarks/kss_stress.py

bench-faults: install
	$(BIN)/python benchmarks/faults.py

# Issue 13's measurement bars: the same model screened with other token samples and sizes (~1.5 min).
bench-stability: install
	$(BIN)/python benchmarks/spectra_stability.py

# The estimator against snapshot pairs with a known spectrum, d = 64 ... 4096 (~30 s).
bench-known-spectrum: install
	$(BIN)/python benchmarks/known_spectrum.py

# The shipped calibration: 800 small labelled probes (about 40 minutes on 2 cores) and 120 deeper,
# wider ones with warmup, clipping, batch size and task varied (about 45 minutes), then the fit and
# its held-out report (about 2 minutes). Rerunning resumes from the .journal files, retrying failures.
calibration: install
	$(BIN)/rksp sweep grids/calibration.yaml --probe --workers 2 --out calibration/runs.parquet
	$(BIN)/rksp sweep grids/scale.yaml --probe --workers 2 --out calibration/scale-runs.parquet
	$(MAKE) refit

# After a change to the estimator: screen every labelled run's init again (labels unchanged; about
# 2 minutes on 2 cores, resumable), then refit.
rescreen: install
	$(BIN)/python calibration/rescreen.py calibration/runs.parquet
	$(BIN)/python calibration/rescreen.py calibration/scale-runs.parquet
	$(MAKE) refit

refit: install
	$(BIN)/rksp calibrate calibration/runs.parquet calibration/scale-runs.parquet --out rksp_cli/default_calibration.json --report calibration/report.md
