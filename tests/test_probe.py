"""Probe tasks and the labelled training runs."""

import json
import logging
import math

import pytest
import torch
from rich.console import Console

from rksp_cli.probe import baselines, probe
from rksp_cli.render import render_probe
from rksp_cli.spec import spec_from_dict
from rksp_cli.tasks import AssociativeRecall, SyntheticLM, make_task
from tests.fakes import AlarmsAt


def _spec(model=None, training=None):
    return spec_from_dict(
        {"model": {"n_layers": 2, **(model or {})}, "training": training or {}, "probe": {"tokens": 256}}
    )


def test_associative_recall_asks_for_the_value_of_a_seen_key():
    task = AssociativeRecall(vocab_size=64, seq_len=20)
    x, y = task.batch(32, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (32, 20)
    assert torch.all(y[:, :-1] == -100)  # loss on the last position only
    keys, values = x[:, 0:8:2], x[:, 1:8:2]
    assert torch.all(keys < 32) and torch.all(values >= 32)  # disjoint halves
    for row in range(32):
        slot = (keys[row] == x[row, -1]).nonzero()
        assert slot.numel() == 1 and values[row, slot[0, 0]] == y[row, -1]


def test_synthetic_lm_is_next_token_prediction_over_high_ids():
    x, y = SyntheticLM(vocab_size=50, seq_len=40).batch(8, torch.Generator().manual_seed(0))
    assert torch.all(x >= 10) and torch.all(x < 50)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_text_file_task(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdefgh" * 20)
    x, y = make_task(str(path), 16, 10).batch(4, torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_high_lr_without_norm_diverges_and_stops_early():
    result = probe(_spec({"norm": "none"}, {"lr": 0.3, "steps": 50}))
    assert result.diverged and result.diverged_step is not None
    assert len(result.losses) == result.diverged_step + 1 < 50
    row = result.row()
    assert row["label"] == 1 and "at step" in row["label_reason"]
    assert {"config.training.lr", "feature.near_unit_mass_mean", "baseline.init_grad_norm"} <= row.keys()


def test_gentle_run_is_stable_deterministic_and_thresholds_are_configurable():
    a = probe(_spec({"norm": "pre"}, {"lr": 1e-3, "steps": 15}))
    b = probe(_spec({"norm": "pre"}, {"lr": 1e-3, "steps": 15}))
    assert not a.diverged and len(a.losses) == 15 and a.losses == b.losses
    strict = probe(_spec({"norm": "pre"}, {"lr": 1e-3, "steps": 15, "diverge_loss": 1.0}))
    assert strict.diverged and strict.diverged_step == 0


def test_baselines_see_a_spike_and_the_step_k_values():
    losses = [3.0] * 30 + [9.0] + [3.0] * 10
    grads = [float(i) for i in range(41)]
    b = baselines(losses, grads, k=10)
    assert b["loss_spikes"] == 1 and b["init_grad_norm"] == 0.0 and b["grad_norm_at_k"] == 9.0
    assert math.isclose(b["grad_norm_var_k"], torch.arange(10.0).var(unbiased=False).item())


def test_probe_refuses_transformers_models(hf_config_file):
    from rksp_cli.errors import InputError

    spec = spec_from_dict({"model": {"hf_config": str(hf_config_file("gpt2"))}})
    with pytest.raises(InputError, match="built-in gpt"):
        probe(spec)


def test_a_probe_without_a_learning_rate_is_an_input_error():
    from rksp_cli.errors import InputError

    for optimizer in ("adamw", "sgd"):
        with pytest.raises(InputError, match=r"training\.lr"):
            probe(_spec({"norm": "pre"}, {"optimizer": optimizer, "steps": 2}))


def test_kss_changes_the_updates_but_not_what_the_label_reads():
    plain = probe(_spec({"norm": "none"}, {"lr": 1e-3, "steps": 12}))
    shaped = probe(_spec({"norm": "none"}, {"lr": 1e-3, "steps": 12, "kss_alpha": 0.15}))
    again = probe(_spec({"norm": "none"}, {"lr": 1e-3, "steps": 12, "kss_alpha": 0.15}))
    assert plain.losses[0] == shaped.losses[0]  # step 0 loss is the task loss of the same init
    assert plain.losses[-1] != shaped.losses[-1] and shaped.losses == again.losses


def test_z_loss_is_the_mean_squared_log_partition_where_a_loss_is_taken():
    from rksp_cli.probe import z_loss

    logits = torch.randn(2, 5, 7)
    targets = torch.full((2, 5), -100)
    targets[:, -1] = 3
    expected = torch.logsumexp(logits[:, -1], -1).square().mean()
    assert torch.allclose(z_loss(logits, targets), expected)


def test_z_loss_changes_training_but_not_what_the_label_reads():
    plain = probe(_spec(training={"lr": 3e-3, "steps": 6}))
    with_z = probe(_spec(training={"lr": 3e-3, "steps": 6, "z_loss": 1.0}))
    assert plain.losses[0] == with_z.losses[0]  # step 0: the task loss of the same init and batch
    assert plain.losses[-1] != with_z.losses[-1]  # the updates differ


def test_final_accuracy_is_measured_on_a_shared_held_out_batch_and_nan_when_diverged():
    spec = _spec(model={"seq_len": 16, "vocab_size": 32}, training={"lr": 1e-3, "steps": 3, "task": "assoc_recall"})
    first, again = probe(spec), probe(spec)
    assert 0.0 <= first.accuracy <= 1.0 and first.accuracy == again.accuracy
    assert first.row()["final_accuracy"] == first.accuracy
    exploded = probe(_spec(model={"norm": "none", "init_std": 2.0}, training={"lr": 10.0, "steps": 50}))
    assert exploded.diverged and math.isnan(exploded.accuracy)


def test_fields_added_later_keep_the_keys_of_configs_that_do_not_use_them():
    """A journal written before qk_norm and z_loss existed still resumes: at their old values they
    stay out of the key, and rows without their columns read as those values."""
    import pandas as pd

    from rksp_cli.sweep import fill_added_later

    base = spec_from_dict({})
    assert spec_from_dict({"model": {"qk_norm": False}, "training": {"z_loss": 0.0}}).key() == base.key()
    assert spec_from_dict({"model": {"qk_norm": True}}).key() != base.key()
    assert spec_from_dict({"training": {"z_loss": 1e-4}}).key() != base.key()
    old = fill_added_later(pd.DataFrame({"config.model.norm": ["pre", "pre"], "config.model.qk_norm": [None, True]}))
    assert old["config.model.qk_norm"].tolist() == [False, True]
    assert old["config.training.z_loss"].tolist() == [0.0, 0.0]


def test_update_sensitivity_restores_the_weights_and_grows_with_the_init_scale():
    from rksp_cli.models import build_subject
    from rksp_cli.probe import update_sensitivity

    values = []
    for std in (0.02, 0.2):
        subject = build_subject(_spec(model={"norm": "none", "init_std": std}).model, 0)
        before = [p.detach().clone() for p in subject.module.parameters()]
        task = make_task("synthetic_lm", subject.vocab_size, subject.seq_len)
        values.append(update_sensitivity(subject.module, task, seed=0))
        assert all(torch.equal(a, b) for a, b in zip(before, subject.module.parameters(), strict=True))
        assert all(p.grad is None for p in subject.module.parameters())
    assert 0 < values[0] < values[1] and all(math.isfinite(v) for v in values)


@pytest.mark.parametrize("kss", [0.0, 0.15])
def test_tracking_the_spectra_reads_the_model_without_changing_its_training(kss):
    training = {"lr": 3e-3, "steps": 21, "kss_alpha": kss}
    plain = probe(_spec(model={"norm": "none"}, training=training))
    tracked = probe(_spec(model={"norm": "none"}, training={**training, "track_every": 10}))
    assert tracked.losses == plain.losses  # bitwise: the screens draw their own tokens, without gradients
    assert [p["step"] for p in tracked.trajectory] == [0, 10, 20]
    assert tracked.trajectory[0]["near_unit_mass_mean"] == tracked.screen.features["near_unit_mass_mean"]
    assert ("kss_soft_mass" in tracked.trajectory[-1]) == bool(kss)
    assert plain.row()["trajectory"] is None
    off = _spec(model={"norm": "none"}, training={**training, "track_every": 0})
    assert off.key() == plain.spec.key()  # off, the field stays out of the key (older journals resume)


def test_training_guard_backs_off_the_probe_s_lr_on_each_alarm_and_records_it(monkeypatch):
    import rksp_cli.monitors.guard as guard

    monkeypatch.setattr(guard, "Monitor", lambda model, every: AlarmsAt([3, 5], every))
    spec = _spec(training={"lr": 1e-3, "steps": 8, "guard": "backoff", "guard_every": 1})
    result = probe(spec)
    assert [(a["step"], a["action"], a["lr_scale"]) for a in result.actions] == [
        (3, "backoff", 0.5),
        (5, "backoff", 0.25),
    ]
    assert json.loads(result.row()["guard_actions"]) == result.actions
    unguarded = probe(_spec(training={"lr": 1e-3, "steps": 8}))
    # the first four updates are the same; after the back-offs the runs part
    assert result.losses[:4] == unguarded.losses[:4] and result.losses[-1] != unguarded.losses[-1]
    assert unguarded.actions == [] and unguarded.row()["guard_actions"] is None
    console = Console(width=80, record=True)
    render_probe(result, console)
    words = " ".join(w for w in console.export_text().split() if w != "│")  # the panel's border wraps lines
    assert "2 actions at steps 3, 5 (by fake); lr x0.25 at the end" in words


def test_training_guard_and_a_watch_are_exclusive():
    spec = _spec(training={"steps": 2, "guard": "skip"})
    with pytest.raises(ValueError, match=r"training\.guard"):
        probe(spec, watch=lambda model, *_: None)


def test_an_unguarded_config_keeps_its_run_key():
    """Runs probed before training.guard existed are found again by a resumed sweep."""
    plain = _spec(training={"lr": 1e-3})
    assert plain.key() == _spec(training={"lr": 1e-3, "guard": None, "guard_every": 50}).key()
    assert plain.key() != _spec(training={"lr": 1e-3, "guard": "backoff"}).key()


def test_progress_goes_to_the_probe_logger_at_info_and_stops_where_training_stops(caplog):
    with caplog.at_level(logging.INFO, logger="rksp_cli.probe"):
        probe(_spec({"norm": "pre"}, {"lr": 1e-3, "steps": 40}))
    lines = [r.getMessage() for r in caplog.records if r.name == "rksp_cli.probe"]
    assert [line.split(":")[0] for line in lines] == [f"step {s}/40" for s in range(2, 41, 2)]
    assert all("ms a step" in line for line in lines)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rksp_cli.probe"):
        run = probe(_spec({"norm": "pre"}, {"lr": 1e-3, "steps": 40, "diverge_loss": 1.0}))
    assert run.diverged_step == 0 and not [r for r in caplog.records if r.name == "rksp_cli.probe"]
