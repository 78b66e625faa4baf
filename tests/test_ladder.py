"""The proxy ladder: bracketing search, the edge law and its interval, and `rksp ladder` end to end."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from rksp_cli.errors import InputError
from rksp_cli.ladder import Search, proxy_point, read_ladder, target_of
from rksp_cli.risk.edge_law import EdgeLaw, bracket, proxy_edges
from rksp_cli.spec import load_spec, spec_from_dict
from tests.test_cli import assert_input_error, rksp


def test_bracket_is_the_largest_trained_lr_below_the_first_divergence():
    lrs = np.array([0.01, 0.03, 0.1, 0.3, 1.0])
    b = bracket(lrs, np.array([0, 0, 1, 0, 1]))  # 0.3 trained above a divergence
    assert (b.lo, b.hi, b.nonmonotone) == (0.03, 0.1, 1)
    assert b.edge == pytest.approx(math.sqrt(0.03 * 0.1))
    assert bracket(lrs, np.zeros(5)).censored and bracket(lrs, np.ones(5)).censored


def _search_to_the_edge(search: Search, edge: float) -> tuple[np.ndarray, np.ndarray]:
    """Run the search against a deterministic run that diverges exactly above ``edge``."""
    lrs = np.array(search.first())
    for _ in range(20):
        proposals = search.next(lrs, lrs > edge)
        if not proposals:
            break
        lrs = np.concatenate([lrs, proposals])
    return lrs, lrs > edge


@pytest.mark.parametrize("edge", [3e-4, 0.0123, 0.5, 2.7, 40.0])
def test_search_brackets_any_edge_in_reach_within_the_resolution(edge):
    search = Search(lr_range=(1e-3, 1.0), lr_points=5, resolution=1.2)
    b = bracket(*_search_to_the_edge(search, edge))
    assert not b.censored and b.lo <= edge < b.hi and b.ratio <= 1.2 * (1 + 1e-5)  # lrs rounded to 6 digits


def test_search_gives_up_past_its_reach_and_says_censored():
    search = Search(lr_range=(1e-3, 1.0), lr_points=5)
    assert bracket(*_search_to_the_edge(search, 1e4)).hi is None  # 100x past the top is out of reach
    assert bracket(*_search_to_the_edge(search, 1e-7)).lo is None


def _edges(law, widths=(16, 32, 64), depths=(2,), seeds=(0, 1), resolution=1.2) -> pd.DataFrame:
    """proxy_edges rows whose brackets hold ``law(width, depth)``, at random offsets."""
    rng = np.random.default_rng(0)
    rows = []
    for w in widths:
        for d in depths:
            for s in seeds:
                lo = law(w, d) / resolution ** rng.uniform(0, 1)
                rows.append({"width": w, "depth": d, "seed": s, "lo": lo, "hi": lo * resolution,
                             "edge": lo * math.sqrt(resolution), "censored": False, "nonmonotone": 0})  # fmt: skip
    return pd.DataFrame(rows)


def test_edge_law_recovers_a_power_law_and_its_interval_holds_the_truth():
    def law(w, d):
        return 3.0 * w**-1.0 * d**-0.5

    fit = EdgeLaw().fit(_edges(law, depths=(2, 4)))
    assert fit.exponents["width"] == pytest.approx(-1.0, abs=0.15)
    assert fit.exponents["depth"] == pytest.approx(-0.5, abs=0.25)
    p = fit.predict(256, 8)
    assert p.interval[0] < law(256, 8) < p.interval[1]
    assert any("width 256" in e for e in p.extrapolated) and any("depth 8" in e for e in p.extrapolated)
    inside = fit.predict(32, 2)
    assert not inside.extrapolated and inside.interval[1] / inside.interval[0] < p.interval[1] / p.interval[0]


def test_edge_law_is_equivariant_in_lr_and_its_risk_is_monotone():
    """Scaling every measured lr by k scales the predicted edge and its interval by k, nothing else."""
    base = _edges(lambda w, d: 2.0 / w)
    scaled = base.assign(lo=base["lo"] * 7, hi=base["hi"] * 7, edge=base["edge"] * 7)
    a, b = EdgeLaw().fit(base).predict(128, 2), EdgeLaw().fit(scaled).predict(128, 2)
    assert b.edge == pytest.approx(7 * a.edge, rel=1e-9)
    assert np.allclose(b.interval, np.multiply(a.interval, 7), rtol=1e-9)
    risks = [a.p_above_edge(lr) for lr in np.geomspace(1e-4, 10, 30)]
    assert np.all(np.diff(risks) >= 0) and risks[0] < 0.05 and risks[-1] > 0.95


def test_edge_law_leaves_censored_proxies_out_and_needs_a_residual_degree_of_freedom():
    edges = _edges(lambda w, d: 1.0 / w, widths=(16, 32), seeds=(0,))
    with pytest.raises(InputError, match="add a width or a depth"):
        EdgeLaw().fit(edges)
    with pytest.raises(InputError, match="no probed proxy"):
        EdgeLaw().fit(pd.DataFrame())
    censored = pd.concat([_edges(lambda w, d: 1.0 / w), pd.DataFrame([{
        "width": 128, "depth": 2, "seed": 0, "lo": None, "hi": 1e-4, "edge": math.nan, "censored": True,
        "nonmonotone": 0}])])  # fmt: skip
    p = EdgeLaw().fit(censored).predict(128, 2)
    assert any("outside the searched lrs" in n for n in p.notes)
    assert p.edge == pytest.approx(1 / 128, rel=0.25)


def test_proxies_keep_the_head_width_and_the_targets_training_settings():
    spec = spec_from_dict({"model": {"d_model": 256, "n_layers": 12, "n_heads": 4, "norm": "post"},
                           "training": {"lr": 1e-3, "warmup_steps": 40, "grad_clip": 1.0}})  # fmt: skip
    target = target_of(spec, ["training.warmup_steps=10"])
    assert (target.width, target.depth, target.head_dim) == (256, 12, 64)
    config = proxy_point(target, 32, 2, 0.01, 3).config
    assert config["model"] | {"d_model": 32, "n_layers": 2, "n_heads": 1, "norm": "post"} == config["model"]
    assert config["training"]["lr"] == 0.01 and config["training"]["warmup_steps"] == 10
    assert config["training"]["grad_clip"] == 1.0 and config["probe"]["seed"] == 3
    with pytest.raises(InputError, match=r"model\.d_model"):
        target_of(spec, ["model.d_model=64"])


@pytest.mark.parametrize("name, norm", [("gpt2", "pre"), ("llama", "rms")])
def test_a_transformers_config_becomes_gpt_proxies_and_says_how(hf_config_file, name, norm):
    target = target_of(load_spec(hf_config_file(name)))
    assert (target.width, target.depth) == (32, 2)
    assert target.base["model"]["norm"] == norm and target.base["model"]["arch"] == "gpt"
    assert any(norm in n for n in target.notes)


@pytest.fixture(scope="module")
def tiny_ladder(tmp_path_factory):
    """A real ladder of tiny proxies (widths 8-32, 1 block, 40 steps): seconds on 2 cores."""
    folder = tmp_path_factory.mktemp("ladder")
    target = folder / "target.yaml"
    target.write_text("model: {d_model: 64, n_layers: 1, n_heads: 2, norm: none}\ntraining: {lr: 0.003, steps: 40}\n"
                      "probe: {tokens: 128}\n")  # fmt: skip
    out = folder / "ladder.parquet"
    args = ("ladder", target, "--out", out, "--widths", "8,16,32", "--lr-range", "1e-3,3", "--lr-points", "5",
            "--resolution", "2", "--set", "training.warmup_steps=5")  # fmt: skip
    return target, out, args, rksp(*args)


def test_ladder_command_fits_predicts_and_resumes_without_new_probes(tiny_ladder):
    _, out, args, first = tiny_ladder
    assert first.exit_code == 0, first.output
    assert "ladder edge at width 64, depth 1" in first.stdout and "extrapolated: width 64" in first.stdout
    frame = read_ladder(out)
    assert json.loads(frame["ladder.overrides"].iloc[0]) == ["training.warmup_steps=5"]
    assert set(frame["config.model.d_model"]) == {8, 16, 32}
    again = rksp(*args, "--json")
    assert again.exit_code == 0 and "round" not in again.stdout  # stdout holds only JSON
    data = json.loads(again.stdout)
    assert len(read_ladder(out)) == len(frame)  # every round replayed from the journal
    assert data["prediction"]["width"] == 64 and 0 <= data["p_above_edge"] <= 1
    assert len(proxy_edges(frame)) == 3


def test_screen_uses_a_matching_ladder_and_refuses_another_family(tiny_ladder, write_yaml):
    target, out, _, built = tiny_ladder
    assert built.exit_code == 0, built.output
    screened = rksp("screen", target, "--ladder", out, "--json", "--fail-above", "0.999")
    assert screened.exit_code == 0, screened.output
    ladder = json.loads(screened.stdout)["ladder"]
    assert ladder["lr"] == 0.003 and ladder["prediction"]["edge"] > 0
    other = rksp("screen", target, "--ladder", out, "--set", "model.norm=pre")
    assert_input_error(other, "model.norm = none", "this config has pre")
    assert_input_error(rksp("screen", target, "--ladder", target.with_suffix(".parquet")), "no such ladder file")


def test_ladder_bad_inputs_are_one_line_exit_2(tmp_path, write_yaml):
    target = write_yaml("model: {d_model: 64}\ntraining: {lr: 0.01}\n")
    out = tmp_path / "l.parquet"
    assert_input_error(rksp("ladder", target, "--out", tmp_path / "l.csv"), "--out", ".parquet")
    assert_input_error(rksp("ladder", target, "--out", out, "--widths", "a,b"), "--widths")
    assert_input_error(rksp("ladder", target, "--out", out, "--lr-range", "1,0.1"), "--lr-range")
    assert_input_error(rksp("ladder", target, "--out", out, "--resolution", "1"), "--resolution")
    assert_input_error(rksp("ladder", target, "--out", out, "--set", "training.lr=1"), "--set training.lr")
    assert not out.exists()
