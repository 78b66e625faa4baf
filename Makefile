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

.PHONY: install screen test lint format clean bench-norms bench-sweep bench-dmd bench-scale bench-kss bench-kss-regime bench-faults bench-monitors bench-monitors-matched bench-monitors-heldout runs-pack runs-unpack runs-unpack-wide bench-monitors-gpu bench-monitors-gpu-table bench-attention-entropy bench-stability bench-known-spectrum bench-ladder bench-published calibration calibration-gpu horizon rescreen token-samples refit

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

# One attention_entropy check, today's Gram route against the QR/SVD route it replaced, at widths
# 128 and 512 (12 layers): under a minute on a 2-core CPU; DEVICE=cuda times it on a GPU.
DEVICE ?= cpu
bench-attention-entropy: install
	$(BIN)/python benchmarks/attention_entropy_cost.py --device $(DEVICE)

bench-dmd: install
	$(BIN)/python -m pip install --quiet pydmd
	$(BIN)/python benchmarks/dmd_speed.py

bench-scale: install
	$(BIN)/python benchmarks/scale.py

bench-kss: install
	$(BIN)/python benchmarks/kss_stress.py

# Issue 15: KSS and the usual fixes where divergence develops slowly; `regime` first (20 runs of
# up to 1000 steps, about 30 minutes on 2 cores), `overhead` (every arm's time per step, interleaved
# in one process, about 20 minutes), `arms` (13 arms x 24 runs, about 7.5 hours), `learning`
# (the baseline and each arm that passed, 3000 steps at a stable lr, 2 seeds: about 35 minutes), `maxlr`
# (max stable lr of 3 norms without and with each prevention that passed, bisection over levels
# of 4 runs, about 2.5 hours per prevention), then `mechanism` (8 runs with the spectra tracked,
# about 20 minutes).
# Resumable: rerun to go on.
bench-kss-regime: install
	$(BIN)/python benchmarks/kss_regime.py regime
	$(BIN)/python benchmarks/kss_regime.py overhead
	$(BIN)/python benchmarks/kss_regime.py arms
	$(BIN)/python benchmarks/kss_regime.py learning
	$(BIN)/python benchmarks/kss_regime.py maxlr
	$(BIN)/python benchmarks/kss_regime.py mechanism

bench-faults: install
	$(BIN)/python benchmarks/faults.py

# Issue 16: the monitors and four spike detectors on natural slow failures and their controls, on
# seeds 42-47 (used to choose only the last two rule changes), two runs at a time, resumable
# (benchmarks/results/monitors/): about 2 hours on 2 cores, nearly all of it deep Post-LN's 18 runs
# of up to 5000 steps. Then the three policies acting on the width-64 runs' alarms (72 runs, about
# 30 minutes). The README's tables are these files' (tests/test_readme_results.py).
bench-monitors: install
	$(BIN)/python benchmarks/monitors.py --first-seed 42 --policies ''
	$(BIN)/python benchmarks/monitors.py --failures attention_logit_growth,low_precision_attention \
		--first-seed 42 --policies backoff,rollback,skip --out benchmarks/results/monitors-actions-fresh.json

# The spike detectors tuned on the controls of seeds 0-5 (run here first if not saved: about an
# hour), judged on bench-monitors' seeds 42-47 beside rksp's monitors: a replay, no training.
bench-monitors-matched: install
	$(BIN)/python benchmarks/monitors.py --first-seed 0 --kinds control,control_low_lr --policies '' \
		--out benchmarks/results/monitors-tuning.json
	$(BIN)/python benchmarks/matched_detectors.py --held-out 42-47

# HELD_OUT_COUNT (6) fresh held-out seeds from HELD_OUT under today's code, end to end: deep Post-LN
# (3 runs a seed, 13-25 minutes a seed on 2 idle cores: 80-150 minutes for six), width 64 (4 runs a
# seed, 1-2 minutes a seed), the detectors at the settings tuned on seeds 0-5 read from an earlier
# comparison (a replay), the rollback twin of each deep run that failed and the rollback-once twin
# of each twin that rolled back twice (10-15 minutes each, two at a time), any failing run that had
# not failed by its horizon trained on to 10,000 steps without monitors (about 19 minutes each, two
# at a time), what each run did in the record's terms (its surges, each monitor's first alarm, a
# twin's actions: a replay), then the bars and the races rksp lost to a detector, pooled over every
# held-out set. Resumable: each run is saved as it finishes (in a git-ignored folder; a twin started
# by hand beside the set is found, not trained twice), and the set's runs, twins included, are
# packed at the end into benchmarks/results/runs/, which is committed: a fresh checkout unpacks them
# first.
HELD_OUT ?= 490
HELD_OUT_COUNT ?= 6
# $(call span,FIRST,COUNT): the seed range A-B of COUNT seeds from FIRST, as the results files name it
span = $(1)-$(shell echo $$(($(1) + $(2) - 1)))
HELD_OUT_SEEDS = $(call span,$(HELD_OUT),$(HELD_OUT_COUNT))
bench-monitors-heldout: install runs-unpack
	$(BIN)/python benchmarks/monitors.py --failures post_ln_without_warmup --first-seed $(HELD_OUT) \
		--seeds $(HELD_OUT_COUNT) --policies '' --workers 2 --threads 1 --progress \
		--out benchmarks/results/monitors-postln-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/monitors.py --failures attention_logit_growth,low_precision_attention \
		--first-seed $(HELD_OUT) --seeds $(HELD_OUT_COUNT) --policies '' --workers 2 --threads 1 \
		--out benchmarks/results/monitors-w64-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/matched_detectors.py --held-out $(HELD_OUT_SEEDS) \
		--settings-from benchmarks/results/monitors-matched-78-83.json \
		--out benchmarks/results/monitors-matched-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/monitors.py --failures post_ln_without_warmup --first-seed $(HELD_OUT) \
		--seeds $(HELD_OUT_COUNT) --kinds failing --policies rollback --guarded-only --only-if failed \
		--workers 2 --threads 1 --out benchmarks/results/monitors-postln-actions-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/monitors.py --failures post_ln_without_warmup --first-seed $(HELD_OUT) \
		--seeds $(HELD_OUT_COUNT) --kinds failing --policies rollback-once --guarded-only \
		--only-if rolled-back-twice --workers 2 --threads 1 \
		--out benchmarks/results/monitors-postln-rollback-once-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/past_horizon.py --seeds $(HELD_OUT_SEEDS)
	$(BIN)/python benchmarks/run_story.py --seeds $(HELD_OUT_SEEDS)
	$(BIN)/python benchmarks/pooled_bars.py --with benchmarks/results/monitors-matched-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/pooled_bars.py --races --with benchmarks/results/monitors-matched-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/pooled_bars.py --watchers --with benchmarks/results/monitors-matched-$(HELD_OUT_SEEDS).json
	$(BIN)/python benchmarks/runs_archive.py pack --seeds $(HELD_OUT_SEEDS)

# The saved runs (git-ignored JSON, about 1 MB a deep run) of seeds SEEDS=A-B, guarded twins
# included, into one committed tar.xz under benchmarks/results/runs/, and every archive back into
# benchmarks/results/monitors/ (a run saved there already is kept). Seconds.
runs-pack: install
	$(BIN)/python benchmarks/runs_archive.py pack --seeds $(SEEDS)
runs-unpack: runs-unpack-wide
	$(BIN)/python benchmarks/runs_archive.py unpack
runs-unpack-wide: install
	$(BIN)/python benchmarks/runs_archive.py unpack --runs $(WIDE_RUNS) --archives benchmarks/results/runs/wide

# Deep Post-LN at width 512 (failures.GPU_FAILURES), needs CUDA: three runs a seed (failing, Pre-LN
# and low-lr controls) of up to 5000 steps, all at once on one GPU, each saved in
# benchmarks/results/monitors-wide/ as it finishes and printing its speed as it goes. Sized for a
# short GPU loan: the default, 2 seeds from GPU_FIRST_SEED, is 6 runs at once, about 5 minutes on
# an H200 with every monitor (9 at once: 7 minutes). Seeds 2-4 (lost) and 5-9 have run; the runs
# of 5-9 are in benchmarks/results/runs/wide/. On a machine whose Python has its own torch, run
# the same command with that Python and PYTHONPATH=. rather than through this target.
# `make bench-monitors-gpu-table GPU_FIRST_SEED=5 GPU_SEEDS=5` tables saved runs, training nothing.
GPU_SEEDS ?= 2
GPU_FIRST_SEED ?= 10
WIDE_RUNS := benchmarks/results/monitors-wide
WIDE := --failures post_ln_without_warmup_wide --policies '' --runs $(WIDE_RUNS) --first-seed $(GPU_FIRST_SEED) \
	--seeds $(GPU_SEEDS) --out benchmarks/results/monitors-wide-$(call span,$(GPU_FIRST_SEED),$(GPU_SEEDS)).json
bench-monitors-gpu: runs-unpack-wide
	$(BIN)/python benchmarks/monitors.py $(WIDE) --device cuda --workers $$((3 * $(GPU_SEEDS))) --threads 1 --progress

bench-monitors-gpu-table: runs-unpack-wide
	$(BIN)/python benchmarks/monitors.py $(WIDE) --saved-only

# Issue 13's measurement bars: the same model screened with other token samples and sizes (~1.5 min).
bench-stability: install
	$(BIN)/python benchmarks/spectra_stability.py

# The estimator against snapshot pairs with a known spectrum, d = 64 ... 4096 (~30 s).
bench-known-spectrum: install
	$(BIN)/python benchmarks/known_spectrum.py

# Issue 14's proxy-ladder bars: the edge at 4W predicted from widths up to W, and the GPT-3 and
# Pythia ladders (about 30 minutes on 2 cores; resumable).
bench-ladder: install
	$(BIN)/python benchmarks/ladder.py

# Issue 14's real configs at their published settings: GPT-2 124M, Pythia 70M-1.4B and GPT-3
# Small-XL screened with the shipped risk model (about 3 minutes on 2 cores; --tokens 8192 scores
# the 2048-wide ones too, about 20 minutes).
bench-published: install
	$(BIN)/python benchmarks/published.py

# The shipped calibration: 800 small labelled probes (about 40 minutes on 2 cores) and 120 deeper,
# wider ones with warmup, clipping, batch size and task varied (about 45 minutes), then the fit and
# its held-out report (about 2 minutes). Rerunning resumes from the .journal files, retrying failures.
calibration: install
	$(BIN)/rksp sweep grids/calibration.yaml --probe --workers 2 --out calibration/runs.parquet
	$(BIN)/rksp sweep grids/scale.yaml --probe --workers 2 --out calibration/scale-runs.parquet
	$(MAKE) token-samples refit

# After a change to the estimator: screen every labelled run's init again (labels unchanged; about
# 2 minutes on 2 cores, resumable), then refit.
rescreen: install
	$(BIN)/python calibration/rescreen.py calibration/runs.parquet
	$(BIN)/python calibration/rescreen.py calibration/scale-runs.parquet
	$(MAKE) token-samples refit

# Issue 14's longer horizon: 48 probes of 1000 steps (about 15 minutes on 2 cores, resumable), then
# what the 200-step label missed and how the shipped risk scores them (calibration/horizon.json).
horizon: install
	$(BIN)/rksp sweep grids/horizon.yaml --probe --workers 2 --out calibration/horizon-runs.parquet
	$(BIN)/python calibration/horizon.py calibration/horizon-runs.parquet

# Each labelled run's init screened on 3 more token samples (about 6 minutes on 2 cores, resumable):
# the report's edge spread and the noise rule of rksp_cli/risk/features.py read them. Rerun after
# `make rescreen`.
token-samples: install
	$(BIN)/python calibration/token_samples.py 4

# Issue 14's GPU-sized ground truth (width 512-1024, 12-24 blocks; two independent draws of 96 and
# 120 probes): about 16 minutes on one H100 with 8 workers, days on 2 CPU cores. Needs CUDA; the
# runs it made are tracked, so `make refit` never needs a GPU.
calibration-gpu: install
	$(BIN)/rksp sweep grids/gpu-scale.yaml --probe --device cuda --workers 8 --out calibration/gpu-scale-runs.parquet
	$(BIN)/rksp sweep grids/gpu-scale-b.yaml --probe --device cuda --workers 8 --out calibration/gpu-scale-b-runs.parquet

refit: install
	$(BIN)/rksp calibrate calibration/runs.parquet calibration/scale-runs.parquet calibration/gpu-scale-runs.parquet calibration/gpu-scale-b-runs.parquet --token-samples calibration/token-samples.parquet --out rksp_cli/default_calibration.json --report calibration/report.md
