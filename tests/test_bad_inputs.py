"""Every bad input, across every command: exit 2 (or 3 where the input is valid but cannot be
scored), no traceback, and one line on stderr naming the field, option or file. Never 0 or 1: 0
would pass a CI gate that scored nothing, 1 means "risk above the gate".

Each case builds its inputs in ``tmp_path`` and returns the command line; the fragments must all
appear in the one error line.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rksp_cli.cli import app
from tests.conftest import hf_config

SMALL = "probe: {tokens: 256}\n"
NOT_WRITABLE = Path("/proc/rksp-no-such-dir")  # no process, root included, may create files in /proc


def _yaml(tmp: Path, text: str, name: str = "screen.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def _json(tmp: Path, data: dict, name: str = "config.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(data))
    return path


def _grid(tmp: Path, axes: str) -> Path:
    _yaml(tmp, "model: {n_layers: 2, d_model: 32}\n" + SMALL, "base.yaml")
    return _yaml(tmp, f"base: base.yaml\naxes:\n{axes}", "grid.yaml")


def _checkpoint(tmp: Path, name: str, poison: str | None = None) -> Path:
    """A checkpoint saved by the installed transformers, with one weight set to NaN if asked."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(name))
    if poison is not None:
        with torch.no_grad():
            model.get_parameter(poison).view(-1)[3] = float("nan")
    model.save_pretrained(tmp / name)
    return tmp / name


def _runs(tmp: Path, n_configs: int, label: int | None = None) -> Path:
    from tests.test_risk_model import synthetic_runs

    frame = synthetic_runs(n_arch=n_configs)
    if label is not None:
        frame["label"] = label
    path = tmp / "runs.parquet"
    frame.to_parquet(path)
    return path


def _screen_json(tmp: Path) -> Path:
    result = CliRunner().invoke(app, ["screen", str(_yaml(tmp, "training: {lr: 0.001}\n" + SMALL)), "--json"])
    path = tmp / "screen.json"
    path.write_text(result.stdout)
    return path


def _screen_only_journal(tmp: Path) -> Path:
    grid = _grid(tmp, "  training.lr: [0.001]\n")
    out = tmp / "sweep.parquet"
    assert CliRunner().invoke(app, ["sweep", str(grid), "--out", str(out)]).exit_code == 0
    return grid


Case = Callable[[Path], list]
CASES: dict[str, tuple[Case, int, tuple[str, ...]]] = {
    # --- the gate passed silently ---------------------------------------------------------------
    "lr inf in yaml": (lambda t: ["screen", _yaml(t, "training: {lr: .inf}\n")], 2, ("training.lr", "finite")),
    "lr inf by --set": (lambda t: ["screen", _yaml(t, SMALL), "--set", "training.lr=inf"], 2, ("training.lr",)),
    "lr nan by --set": (lambda t: ["screen", _yaml(t, SMALL), "--set", "training.lr=nan"], 2, ("training.lr",)),
    "lr empty by --set": (lambda t: ["screen", _yaml(t, SMALL), "--set", "training.lr="], 2, ("--set", "no value")),
    "lr unset, gated": (lambda t: ["screen", _yaml(t, SMALL), "--fail-above", "0.5"], 2, ("training.lr",)),
    "lr unset, scored": (lambda t: ["screen", _yaml(t, SMALL)], 3, ("training.lr is not set",)),
    "empty yaml": (lambda t: ["screen", _yaml(t, "")], 2, ("screen.yaml", "empty")),
    "comments-only yaml": (lambda t: ["screen", _yaml(t, "# nothing\n")], 2, ("screen.yaml", "empty")),
    # --- values that crashed ----------------------------------------------------------------------
    "init_std 0": (lambda t: ["screen", _yaml(t, "model: {init_std: 0}\n")], 2, ("model.init_std",)),
    "init_std inf": (lambda t: ["screen", _yaml(t, "model: {init_std: .inf}\n")], 2, ("model.init_std",)),
    "init_std overflows": (
        lambda t: ["screen", _yaml(t, "model: {init_std: 1.0e+30}\ntraining: {lr: 0.001}\n" + SMALL)],
        3,
        ("NaN or inf", "init scale"),
    ),
    "seed 10**23": (lambda t: ["screen", _yaml(t, f"probe: {{seed: {10**23}}}\n")], 2, ("probe.seed",)),
    "seed negative": (lambda t: ["screen", _yaml(t, "probe: {seed: -1}\n")], 2, ("probe.seed",)),
    "faults seed negative": (lambda t: ["faults", "--seed", "-1"], 2, ("--seed",)),
    "d_model 10**6": (
        lambda t: ["screen", _yaml(t, "model: {d_model: 1000000}\ntraining: {lr: 0.001}\n")],
        2,
        ("model.d_model", "memory", "--force"),
    ),
    "vocab 10**12": (
        lambda t: ["screen", _yaml(t, "model: {vocab_size: 1000000000000}\ntraining: {lr: 0.001}\n")],
        2,
        ("model.vocab_size", "memory"),
    ),
    "tokens 10**9": (
        lambda t: ["screen", _yaml(t, "probe: {tokens: 1000000000}\ntraining: {lr: 0.001}\n")],
        2,
        ("probe.tokens", "memory"),
    ),
    "10000 blocks over the time limit": (
        lambda t: ["screen", _yaml(t, "model: {n_layers: 10000}\ntraining: {lr: 0.001}\n"), "--max-minutes", "0.1"],
        2,
        ("model.n_layers", "--max-minutes"),
    ),
    "a bare llama config is a 7B model": (
        lambda t: ["screen", _json(t, {"model_type": "llama"}), "--max-minutes", "1"],
        2,
        ("config.json", "--max-minutes"),
    ),
    "probe of a model that cannot fit": (
        lambda t: ["probe", _yaml(t, "model: {d_model: 1000000}\ntraining: {lr: 0.001}\n")],
        2,
        ("model.d_model", "memory"),
    ),
    "probe of a transformers config": (lambda t: ["probe", _hf_probe_config(t)], 2, ("built-in gpt",)),
    # --- transformers configs and checkpoints -------------------------------------------------------
    "heads do not divide hidden size": (
        lambda t: ["screen", _json(t, {"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4})],
        2,
        ("config.json", "not a valid llama config"),
    ),
    "string vocab size": (
        lambda t: ["screen", _json(t, {"model_type": "gpt2", "vocab_size": "big"})],
        2,
        ("config.json", "vocab_size"),
    ),
    "unknown model type": (lambda t: ["screen", _json(t, {"model_type": "nope"})], 2, ("config.json", "nope")),
    "encoder-decoder": (
        lambda t: ["screen", _json(t, {"model_type": "t5", "d_model": 32, "num_layers": 2, "num_heads": 4})],
        2,
        ("config.json", "encoder-decoder"),
    ),
    "nan weights": (
        lambda t: ["screen", _checkpoint(t, "llama", poison="model.layers.1.mlp.up_proj.weight")],
        2,
        ("layers.1.mlp.up_proj.weight", "NaN"),
    ),
    "nan weights, streamed": (
        lambda t: ["screen", _checkpoint(t, "llama", poison="model.layers.1.mlp.up_proj.weight"), "--stream"],
        2,
        ("layers.1.mlp.up_proj.weight", "NaN"),
    ),
    "nan embedding": (
        lambda t: ["screen", _checkpoint(t, "gpt2", poison="transformer.wte.weight")],
        2,
        ("wte.weight", "NaN"),
    ),
    "pickle without permission": (
        lambda t: ["screen", _pickle_checkpoint(t)],
        2,
        ("weights.bin", "--allow-pickle"),
    ),
    "corrupt safetensors": (lambda t: ["screen", _corrupt_safetensors(t)], 2, ("model.safetensors",)),
    # --- grids and sweeps ---------------------------------------------------------------------------
    "grid num 1e8": (
        lambda t: [
            "sweep",
            _grid(t, "  training.lr: {log: [1.0e-4, 1.0], num: 100000000}\n"),
            "--out",
            t / "s.parquet",
        ],
        2,
        ("axes.training.lr", "100,000"),
    ),
    "grid product too large": (
        lambda t: [
            "sweep",
            _grid(
                t,
                "  training.lr: {log: [1.0e-4, 1.0], num: 1000}\n"
                "  training.warmup_steps: {linear: [0, 999], num: 1000}\n",
            ),
            "--out",
            t / "s.parquet",
        ],
        2,
        ("axes", "sample"),
    ),
    "grid range text keeps its brackets": (
        lambda t: ["sweep", _grid(t, "  training.lr: {log: [a, b], num: 3}\n"), "--out", t / "s.parquet"],
        2,
        ("axes.training.lr", "{log: [low, high], num: N}"),
    ),
    "grid sample too large": (
        lambda t: [
            "sweep",
            _grid(
                t,
                "  training.lr: {log: [1.0e-4, 1.0], num: 1000}\n"
                "  training.warmup_steps: {linear: [0, 999], num: 1000}\nsample: 200000\n",
            ),
            "--out",
            t / "s.parquet",
        ],
        2,
        ("sample", "100,000"),
    ),
    "probe resumes a screen-only journal": (
        lambda t: ["sweep", _screen_only_journal(t), "--out", t / "sweep.parquet", "--probe"],
        2,
        ("sweep.parquet.journal", "without --probe"),
    ),
    "sweep --out not writable": (
        lambda t: ["sweep", _grid(t, "  training.lr: [0.001]\n"), "--out", NOT_WRITABLE / "s.parquet"],
        2,
        ("--out", "cannot write"),
    ),
    "sweep --out is a directory": (
        lambda t: ["sweep", _grid(t, "  training.lr: [0.001]\n"), "--out", _dir(t, "x.parquet")],
        2,
        ("--out", "directory"),
    ),
    "sweep --out wrong suffix": (
        lambda t: ["sweep", _grid(t, "  training.lr: [0.001]\n"), "--out", t / "s.csv"],
        2,
        ("--out", ".parquet"),
    ),
    # --- output paths, checked before the work ------------------------------------------------------
    "screen --report not writable": (
        lambda t: ["screen", _yaml(t, SMALL), "--report", NOT_WRITABLE / "r.html"],
        2,
        ("--report", "cannot write"),
    ),
    "screen --plot not writable": (
        lambda t: ["screen", _yaml(t, SMALL), "--plot", NOT_WRITABLE / "p.png"],
        2,
        ("--plot", "cannot write"),
    ),
    "screen --report under a file": (
        lambda t: ["screen", _yaml(t, SMALL), "--report", _yaml(t, "x", "file.txt") / "r.html"],
        2,
        ("--report", "not a directory"),
    ),
    "calibrate --out not writable": (
        lambda t: ["calibrate", _runs(t, 60), "--out", NOT_WRITABLE / "c.json"],
        2,
        ("--out", "cannot write"),
    ),
    "compare --report not writable": (
        lambda t: ["compare", _screen_json(t), _screen_json(t), "--report", NOT_WRITABLE / "c.html"],
        2,
        ("--report", "cannot write"),
    ),
    # --- calibration and monitoring inputs ------------------------------------------------------------
    "calibrate on one run": (lambda t: ["calibrate", _one_run(t), "--out", t / "c.json"], 2, ("runs", "architecture")),
    "calibrate on two configurations": (
        lambda t: ["calibrate", _runs(t, 2), "--out", t / "c.json"],
        2,
        ("runs.parquet", "needs at least 5"),
    ),
    "calibrate on one outcome": (
        lambda t: ["calibrate", _runs(t, 20, label=0), "--out", t / "c.json"],
        2,
        ("runs.parquet", "label = 0"),
    ),
    "watch a binary file": (lambda t: ["watch", _binary(t), "--once"], 2, ("metrics.jsonl", "binary")),
    "watch a missing file": (lambda t: ["watch", t / "none.jsonl", "--once"], 2, ("none.jsonl",)),
    "compare a non-json file": (lambda t: ["compare", _binary(t), _binary(t)], 2, ("metrics.jsonl",)),
    # --- flags ------------------------------------------------------------------------------------
    "unknown option": (lambda t: ["screen", _yaml(t, SMALL), "--bogus"], 2, ("--bogus",)),
    "missing argument": (lambda t: ["screen"], 2, ("path",)),
    "fail-above out of range": (lambda t: ["screen", _yaml(t, SMALL), "--fail-above", "2"], 2, ("--fail-above",)),
    "threads 0": (lambda t: ["--threads", "0", "screen", _yaml(t, SMALL)], 2, ("--threads",)),
}


def _hf_probe_config(tmp: Path) -> Path:
    _json(tmp, {"model_type": "gpt2"}, "c.json")
    return _yaml(tmp, "model: {hf_config: c.json}\ntraining: {lr: 0.001}\n", "p.yaml")


def _dir(tmp: Path, name: str) -> Path:
    (tmp / name).mkdir()
    return tmp / name


def _binary(tmp: Path) -> Path:
    path = tmp / "metrics.jsonl"
    path.write_bytes(bytes(range(256)) * 4)
    return path


def _one_run(tmp: Path) -> Path:
    from tests.test_risk_model import synthetic_runs

    path = tmp / "runs.parquet"
    synthetic_runs(n_arch=5).head(1).to_parquet(path)
    return path


def _pickle_checkpoint(tmp: Path) -> Path:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(hf_config("gpt2"))
    model.config.to_json_file(tmp / "config.json")
    torch.save(model.state_dict(), tmp / "weights.bin")
    return tmp / "weights.bin"


def _corrupt_safetensors(tmp: Path) -> Path:
    directory = _checkpoint(tmp, "gpt2")
    (directory / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    return directory


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_or_3_with_one_line_naming_it(name, tmp_path):
    make, code, fragments = CASES[name]
    if "not writable" in name and not NOT_WRITABLE.parent.is_dir():
        pytest.skip("needs Linux's /proc as a folder nobody may write in")
    result = CliRunner().invoke(app, [str(a) for a in make(tmp_path)])
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith(("error:", "cannot assess:"))]
    assert len(errors) == 1, result.stderr
    assert lines[-1] == errors[0], result.stderr  # the error is the last word, whatever came before
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_the_matrix_is_large_enough():
    assert len(CASES) >= 40


def test_a_refused_output_path_costs_no_work(tmp_path, monkeypatch):
    """The write check runs before the screen: the screen itself is never called."""
    import rksp_cli.screen

    def boom(*args, **kwargs):
        raise AssertionError("the screen ran before the output path was checked")

    monkeypatch.setattr(rksp_cli.screen, "screen", boom)
    result = CliRunner().invoke(app, ["screen", str(_yaml(tmp_path, SMALL)), "--report", str(NOT_WRITABLE / "r.html")])
    assert result.exit_code == 2


def test_force_runs_what_the_estimate_would_refuse(tmp_path):
    path = _yaml(tmp_path, "model: {n_layers: 3}\ntraining: {lr: 0.001}\n" + SMALL)
    refused = CliRunner().invoke(app, ["screen", str(path), "--max-minutes", "0"])
    assert refused.exit_code == 2 and "--max-minutes" in refused.stderr
    forced = CliRunner().invoke(app, ["screen", str(path), "--max-minutes", "0", "--force", "--json"])
    assert forced.exit_code == 0, forced.stderr
    assert json.loads(forced.stdout)["estimate"]["seconds"] > 0


def test_a_journal_from_before_settings_were_recorded_is_read_by_its_rows(tmp_path):
    """Old journals have no settings table: a labelled row says it was a probe sweep."""
    grid = _grid(tmp_path, "  training.lr: [0.001]\n")
    journal = tmp_path / "s.parquet.journal"
    db = sqlite3.connect(journal)
    db.execute("CREATE TABLE points (key TEXT PRIMARY KEY, row TEXT NOT NULL)")
    db.execute("INSERT INTO points VALUES ('k', ?)", (json.dumps({"key": "k", "label": 1}),))
    db.commit()
    db.close()
    result = CliRunner().invoke(app, ["sweep", str(grid), "--out", str(tmp_path / "s.parquet")])
    assert result.exit_code == 2 and "made with --probe" in result.stderr
