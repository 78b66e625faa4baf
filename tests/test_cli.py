"""The command line as users and CI jobs meet it: exit codes, formats, one-line errors."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rksp_cli.cli import app

runner = CliRunner()
SCREENS = sorted(Path(__file__).parent.parent.joinpath("screens").glob("*.yaml"))
SMALL = ["--set", "probe.tokens=512"]


def rksp(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_input_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("path", SCREENS, ids=lambda p: p.name)
def test_every_shipped_screen_runs(path):
    result = rksp("screen", path, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["config"]["probe"]["tokens"] >= 2048


def test_json_output_is_pure_json_with_the_contract_keys():
    result = rksp("screen", SCREENS[0], *SMALL, "--json")
    data = json.loads(result.stdout)
    assert {"risk", "verdict", "reason", "features", "layers", "config"} <= data.keys()
    assert "near_unit_mass_mean" in data["features"]
    assert all("near_unit_mass" in layer for layer in data["layers"])
    assert data["config"]["probe"]["tokens"] == 512  # the resolved config, overrides applied


def test_table_shows_the_verdict_and_says_the_fallback_is_uncalibrated():
    result = rksp("screen", SCREENS[0], *SMALL, "--calibration", "none")
    assert result.exit_code == 0
    assert "risk" in result.stdout and "not calibrated" in result.stdout
    assert "M≈1" in result.stdout


def test_the_shipped_calibration_is_the_default_and_sees_the_learning_rate(write_yaml):
    path = write_yaml("model: {norm: none}\nprobe: {tokens: 512}\n")
    low, high = (json.loads(rksp("screen", path, "--set", f"training.lr={lr}", "--json").stdout) for lr in (3e-4, 1.0))
    assert low["risk_model"]["calibrated"] is True and low["lr_edge"] is not None
    assert low["risk"] < high["risk"] and high["verdict"] == "high"
    assert low["lr_edge"] == high["lr_edge"]  # the edge belongs to the model, not to the lr asked about
    no_lr = rksp("screen", path, "--fail-above", "0.5")
    assert_input_error(no_lr, "training.lr")


def test_csv_has_one_row_per_block(write_yaml):
    path = write_yaml("model: {norm: pre, n_layers: 3}\nprobe: {tokens: 512}\n")
    lines = rksp("screen", path, "--csv").stdout.strip().splitlines()
    assert lines[0].startswith("layer,") and "near_unit_mass" in lines[0]
    assert len(lines) == 4


def test_fail_above_gates_the_exit_code(write_yaml):
    noln = write_yaml("model: {norm: none}\ntraining: {lr: 0.01}\nprobe: {tokens: 512}\n")
    rule = ("--calibration", "none")  # the rule's risk for this model is 0.9 whatever the lr
    assert rksp("screen", noln, *rule, "--fail-above", "0.5").exit_code == 1
    assert rksp("screen", noln, *rule, "--fail-above", "0.95").exit_code == 0
    assert rksp("screen", noln, *rule, "--fail-above", "0.5", "--json").exit_code == 1


def test_identity_blocks_exit_3_with_the_reason(write_yaml):
    path = write_yaml("model: {norm: pre, zero_init_residual: true}\nprobe: {tokens: 512}\n")
    result = rksp("screen", path)
    assert result.exit_code == 3
    assert "identity" in result.stderr and "Traceback" not in result.output


def test_transformers_config_json_is_accepted_directly(hf_config_file):
    result = rksp("screen", hf_config_file("llama"), *SMALL, "--set", "training.lr=3e-4", "--json")
    assert result.exit_code == 0, result.stderr
    model = json.loads(result.stdout)["model"]
    assert model["architecture"] == "LlamaModel" and model["norm"] == "rms"  # found in the forward pass


def test_a_screen_without_a_learning_rate_shows_the_edge_but_never_exits_0(hf_config_file):
    result = rksp("screen", hf_config_file("llama"), *SMALL, "--json")
    assert result.exit_code == 3, result.stderr
    assert json.loads(result.stdout)["lr_edge"] is not None  # the edge is still reported
    assert "training.lr is not set" in result.stderr


def test_a_screen_whose_sample_the_fit_matches_exactly_exits_3_even_under_a_gate(write_yaml):
    path = write_yaml("model: {d_model: 128, n_layers: 2}\ntraining: {lr: 0.001}\nprobe: {tokens: 64}\n")
    result = rksp("screen", path, "--fail-above", "0.5")
    assert result.exit_code == 3, result.stderr
    assert "fits them exactly" in result.stderr and "--set training.lr" not in result.stderr


@pytest.mark.parametrize(
    ("yaml_text", "fragments"),
    [
        ("training: {lrr: 0.1}\n", ["training.lrr", "unknown field"]),
        ("model: {d_model: wide}\n", ["model.d_model", "valid integer"]),
        ("model: {norm: layer}\n", ["model.norm"]),
        ("probe: {rank: 0}\n", ["probe.rank"]),
        ("probe: {input: missing.txt}\n", ["probe.input", "does not exist"]),
        ("model: {hf_config: nowhere.json}\n", ["model.hf_config", "does not exist"]),
        ("model: {d_model: 64, n_heads: 5}\n", ["divisible"]),
        ("model: [1, 2]\n", ["model"]),
        ("model: {norm: pre\n", ["not valid YAML"]),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_field(write_yaml, yaml_text, fragments):
    path = write_yaml(yaml_text)
    assert_input_error(rksp("screen", path), str(path), *fragments)


def test_bad_transformers_configs_exit_2_naming_the_file(tmp_path):
    cases = {
        "broken.json": ('{"model_type": "gpt2", ', "not valid JSON"),
        "untyped.json": ('{"n_layer": 2}', "model_type"),
        "alien.json": ('{"model_type": "no-such-arch"}', "does not know model_type"),
    }
    for name, (text, fragment) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert_input_error(rksp("screen", path), str(path), fragment)


def test_bad_paths_and_flags_exit_2(tmp_path):
    assert_input_error(rksp("screen", tmp_path / "nope.yaml"), "no such file")
    (tmp_path / "notes.txt").write_text("hi")
    assert_input_error(rksp("screen", tmp_path / "notes.txt"), "unsupported file type")
    assert_input_error(rksp("screen", tmp_path), "config.json")
    assert_input_error(rksp("screen", SCREENS[0], "--set", "training.lr"), "--set", "SECTION.FIELD=VALUE")
    assert_input_error(rksp("screen", SCREENS[0], "--set", "training.lr=fast"), "training.lr")
    assert_input_error(rksp("screen", SCREENS[0], "--json", "--csv"), "exclusive")


def test_version():
    assert rksp("--version").stdout.startswith("rksp ")


def test_probe_prints_the_label_as_json(write_yaml):
    path = write_yaml("model: {norm: none, n_layers: 2}\ntraining: {lr: 0.3}\nprobe: {tokens: 256}\n")
    result = rksp("probe", path, "--steps", "30", "--json")
    assert result.exit_code == 0, result.stderr
    row = json.loads(result.stdout)
    assert row["label"] == 1 and row["config.training.steps"] == 30 and row["steps_run"] < 30


def test_sweep_then_calibrate_then_screen_with_that_calibration(tmp_path):
    from tests.test_risk_model import synthetic_runs

    runs = tmp_path / "runs.parquet"
    synthetic_runs(n_arch=60).to_parquet(runs)
    cal = tmp_path / "family.json"
    result = rksp("calibrate", runs, "--out", cal, "--bootstrap", "50")
    assert result.exit_code == 0, result.stderr
    assert cal.is_file() and "AUROC" in cal.with_suffix(".md").read_text()

    (tmp_path / "base.yaml").write_text("model: {n_layers: 2, d_model: 32}\nprobe: {tokens: 256}\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("base: base.yaml\naxes:\n  training.lr: [0.0001, 0.01, 0.5]\n  model.norm: [pre, none]\n")
    out = tmp_path / "sweep.parquet"
    result = rksp("sweep", grid, "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "riskiest" in result.stdout and (tmp_path / "sweep-heatmap.png").stat().st_size > 1000

    screen = json.loads(rksp("screen", SCREENS[0], *SMALL, "--calibration", cal, "--json").stdout)
    # the synthetic runs' spectra are not a real model's: the screen says it extrapolates, with an interval
    assert screen["extrapolated"] is True and screen["risk_model"]["calibrated"] is False
    assert screen["reason"].startswith("extrapolated") and len(screen["risk_interval"]) == 2
    assert "lr_edge" in screen and "risk 0.2" in screen["reason"]


def test_a_high_risk_screen_advises_only_what_the_shipped_benchmark_measured(write_yaml):
    from rksp_cli.risk.preventions import advice

    path = write_yaml("model: {norm: none}\ntraining: {lr: 0.1}\nprobe: {tokens: 512}\n")
    data = json.loads(rksp("screen", path, "--json").stdout)
    assert data["verdict"] == "high"
    assert advice("none") in data["risk_model"]["notes"]  # from rksp_cli/preventions.json, or "none measured"


def test_moe_gpt_screens_and_is_flagged_outside_the_dense_calibration(write_yaml):
    path = write_yaml("model: {n_layers: 2, n_experts: 2}\ntraining: {lr: 0.003}\nprobe: {tokens: 512}\n")
    data = json.loads(rksp("screen", path, "--json").stdout)
    assert data["model"]["parameters"] > 0 and len(data["layers"]) == 2
    assert any("n_experts = 2" in flag for flag in data["out_of_range"])


def test_a_dense_transformers_model_is_not_flagged_for_experts_and_an_moe_one_is(hf_config_file):
    """A config leaves n_experts to the model: the screen reads it from the model, not from a None."""
    for name, flagged in (("llama", False), ("mixtral", True)):
        data = json.loads(rksp("screen", hf_config_file(name), *SMALL, "--set", "training.lr=3e-4", "--json").stdout)
        assert any("n_experts" in flag for flag in data["out_of_range"]) is flagged, data["out_of_range"]
        assert not any("ResDMD" in w for w in data["warnings"])  # nothing a user could act on


def test_a_huge_learning_rate_is_reported_in_readable_numbers(write_yaml):
    path = write_yaml("training: {lr: 1.0e+300}\nprobe: {tokens: 256}\n")
    data = json.loads(rksp("screen", path, "--json").stdout)
    assert data["verdict"] == "high" and len(data["reason"]) < 120, data["reason"]


def test_threads_option_pins_torch(write_yaml):
    import torch

    before = torch.get_num_threads()
    try:
        assert (
            rksp("--threads", "2", "screen", write_yaml("training: {lr: 0.001}\nprobe: {tokens: 256}\n")).exit_code == 0
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_watch_follows_a_log_into_a_pipe(tmp_path):
    """Not a terminal (a CI log): the dashboard is printed, and printed again when a check arrives."""
    import subprocess
    import sys
    import threading
    import time

    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"event": "start", "every": 10, "monitors": ["r_metric"]}) + "\n")
    with log.open("a") as f:
        f.write(json.dumps({"step": 0, "loss": 3.0, "metrics": {"r_metric": 0.1}, "alerts": []}) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rksp_cli", "watch", str(log), "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()

    def wait_for(text: str, seconds: float = 60) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(text in line for line in list(lines)):
                return True
            time.sleep(0.1)
        return False

    try:
        assert wait_for("last step 0"), lines  # start-up can be slow on a busy machine
        with log.open("a") as f:
            f.write(json.dumps({"step": 10, "loss": 2.5, "metrics": {"r_metric": 0.2}, "alerts": []}) + "\n")
        assert wait_for("last step 10"), lines
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_heatmap_keeps_the_learning_rate_on_an_axis():
    import pandas as pd

    from rksp_cli.report import heatmap_axes

    frame = pd.DataFrame(
        {"config.model.norm": ["pre", "none"] * 4, "config.model.n_layers": [2, 2, 4, 4] * 2,
         "config.training.lr": [0.001] * 4 + [0.1] * 4, "config.probe.seed": [0] * 8}
    )  # fmt: skip
    assert heatmap_axes(frame) == ["config.training.lr", "config.model.norm"]
    assert heatmap_axes(frame.drop(columns="config.training.lr")) == ["config.model.norm", "config.model.n_layers"]


def test_the_gate_says_what_it_gates_on(write_yaml):
    path = write_yaml("training: {lr: 0.01}\nprobe: {tokens: 256}\n")
    spread = rksp("screen", path, "--fail-above", "0.9")
    assert spread.exit_code == 0 and "gate: highest risk over 3 token samples" in spread.stdout
    single = rksp("screen", path, "--fail-above", "0.9", "--spread", "1")
    assert single.exit_code == 0 and "gate: risk " in single.stdout and "spread over" not in single.stdout


@pytest.mark.parametrize("command", ["probe", "sweep", "ladder"])
def test_an_absent_device_is_refused_before_any_work(command, tmp_path, write_yaml):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present here")
    config = write_yaml("model: {n_layers: 2}\ntraining: {lr: 0.001, steps: 2}\nprobe: {tokens: 256}\n")
    grid = write_yaml(f"base: {config}\naxes:\n  training.lr: [0.001]\n", "grid.yaml")
    out = tmp_path / "out.parquet"
    args = {"probe": [str(config)], "sweep": [str(grid), "--probe", "--out", str(out)],
            "ladder": [str(config), "--out", str(out)]}[command]  # fmt: skip
    result = rksp(command, *args, "--device", "cuda")
    assert result.exit_code == 2, result.output
    assert "--device cuda: no such device here" in result.stderr
    assert not out.exists() and not out.with_name("out.parquet.journal").exists()
