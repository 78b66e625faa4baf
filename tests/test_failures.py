"""Natural-failure harness and the mechanism monitors it brought (issue 16): the signals compute what
they say, alarm on the growth they are built for and not on a plateau, a watch never changes
training, and the head-to-head table counts leads and false alarms as documented."""

import dataclasses
import importlib
import json
import math
from pathlib import Path

import pytest
import torch

from rksp_cli.models.gpt import GPT, GPTConfig
from rksp_cli.monitors.attention_entropy import find_attention
from rksp_cli.monitors.attention_logits import LAG, LEVEL, AttentionLogits, max_logit
from rksp_cli.monitors.base import Alert
from rksp_cli.monitors.failures import MIN_PROGRESS, WINDOW, WatchedRun, head_to_head, lost_step
from rksp_cli.monitors.output_logits import OutputLogits
from rksp_cli.probe import probe
from rksp_cli.spec import spec_from_dict
from tests.fakes import AlarmsAt


def test_max_logit_is_the_largest_scaled_dot_product_over_heads_and_pairs():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 7, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    explicit = max(abs(float(q[h, i] @ k[h, j])) for h in range(3) for i in range(7) for j in range(5))
    assert max_logit(q, k) == pytest.approx(explicit / math.sqrt(8), rel=1e-5)


def test_built_in_projection_is_the_attention_s_own_queries_and_keys():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1, qk_norm=True))
    site = find_attention(model)[0]
    x = torch.randn(1, 9, 64)
    q, k, _ = site.source.heads(x)
    q2, k2 = site.project(x[0])
    assert torch.equal(q[0], q2) and torch.equal(k[0], k2)


def _logit_alarms(scale_per_check: float, checks: int = 30) -> list[Alert]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1))
    monitor = AttentionLogits(find_attention(model))
    x = torch.randint(0, 103, (4, 32))
    alerts = []
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(400)  # logits well above the saturation line from the start
        for step in range(checks):
            model(x)
            alerts += monitor.check(step)[1]
            model.blocks[0].attn.qkv.weight.mul_(scale_per_check)
    return alerts


def test_attention_logits_alarm_on_fast_growth_not_on_a_plateau_or_slow_growth():
    grown = _logit_alarms(1.2)  # logits x1.44 a check: 4.3x over LAG checks
    assert grown and grown[0].step == LAG + 3 - 1 and grown[0].value >= LEVEL  # full history, patience 3
    assert _logit_alarms(1.0) == []  # the same saturated logits, holding: a sharp but stable model
    # x1.21 a check, 2.1x over LAG checks: large and growing, as a healthy deep Pre-LN model's logits do
    assert _logit_alarms(1.1) == []


def test_output_logits_report_the_mean_log_partition_function():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1))
    monitor = OutputLogits(model.head)
    logits, _ = model(torch.randint(0, 103, (2, 16)))
    metrics, _ = monitor.check(0)
    assert metrics["log_z_mean"] == pytest.approx(float(torch.logsumexp(logits.detach(), -1).mean()), rel=1e-5)
    assert monitor.check(1) == ({}, [])  # nothing captured since: nothing reported


def test_a_watch_sees_every_step_and_never_changes_training():
    raw = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 16},
           "training": {"lr": 3e-3, "steps": 12}, "probe": {"tokens": 64}}  # fmt: skip
    spec = spec_from_dict(raw, source="test")
    from rksp_cli.monitors import Monitor

    seen = []

    def watch(model, optimizer, schedule):
        monitor = Monitor(model, every=2)
        step = monitor.step
        monitor.step = lambda s, loss: seen.append(s) or step(s, loss)
        return monitor

    watched, plain = probe(spec, watch=watch), probe(spec)
    assert seen == list(range(12))
    assert watched.losses == plain.losses and watched.grad_norms == plain.grad_norms  # bitwise


def _curve(fall_to: float, back_to: float | None, n: int = 2000) -> list[float]:
    """Loss 5 at step 0, falling linearly to ``fall_to`` by step 600, then (if given) rising to ``back_to``."""
    out = []
    for t in range(n):
        v = 5 - (5 - fall_to) * min(t, 600) / 600
        if back_to is not None and t > 1000:
            v = fall_to + (back_to - fall_to) * min(t - 1000, 600) / 600
        out.append(v)
    return out


def test_lost_step_marks_a_run_that_gave_back_what_it_learned():
    step = lost_step(_curve(3.0, 5.0))
    assert step is not None and 1000 < step < 1700
    assert lost_step(_curve(3.0, None)) is None  # learned and kept it
    assert lost_step(_curve(3.0, 3.8)) is None  # gave back 40%: degraded, not lost
    assert lost_step(_curve(5 - MIN_PROGRESS / 2, 5.0)) is None  # never learned enough to lose
    assert lost_step(_curve(3.0, 5.0)[:WINDOW]) is None


def _run(kind: str, alarms: dict[str, int], exploded: int | None, n: int = 400) -> WatchedRun:
    alerts = [Alert(s, m, None, 0.0, 0.0, "alarm", "") for m, s in alarms.items()]
    losses = [1.0] * n if exploded is None else [1.0] * exploded + [math.inf]
    return WatchedRun("f", kind, 0, n, losses, [1.0] * len(losses), exploded, alerts, ["m"], 0.01, {"m": 0.0001})


def test_head_to_head_counts_leads_before_the_failure_and_false_alarms_on_controls():
    runs = [
        _run("failing", {"m": 100}, exploded=300),  # lead 200
        _run("failing", {"m": 350}, exploded=300),  # alarmed after the failure: no lead
        _run("control", {}, None),
        _run("control", {"m": 10}, None),  # a false alarm
        _run("control_low_lr", {"m": 20}, None),  # one on a control of the failing architecture
    ]
    rows = {r["watcher"]: r for r in head_to_head(runs)}
    m = rows["m"]
    assert (m["failed"], m["alarmed"], m["median_lead_steps"], m["false_alarms"]) == (2, 1, 200, 2)
    assert m["false_alarms_by_control"] == {"control": "1/2", "control_low_lr": "1/1"}
    assert m["median_lead_share"] == pytest.approx(200 / 300) and m["rksp"]
    assert m["overhead_pct"] == pytest.approx(100 * 0.0001 / (50 * 0.01))
    megatron = rows["Megatron-LM spiky loss"]  # fires on the non-finite loss: lead 0
    assert not megatron["rksp"] and megatron["alarmed"] == 2 and megatron["median_lead_steps"] == 0


def test_head_to_head_counts_a_control_that_failed_apart_from_the_clean_ones():
    runs = [
        _run("failing", {"m": 100}, exploded=300),
        _run("control", {}, None),
        _run("control", {"m": 250}, exploded=300),  # the control itself exploded: its alarm is no false alarm
    ]
    m = {r["watcher"]: r for r in head_to_head(runs)}["m"]
    assert (m["false_alarms"], m["controls"], m["controls_failed"]) == (0, 1, 1)
    assert m["false_alarms_by_control"] == {"control": "0/1"}


@pytest.fixture
def bench(monkeypatch):
    """``benchmarks/monitors.py`` as a module (it imports its sibling scripts by bare name)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    return importlib.import_module("benchmarks.monitors")


def test_the_benchmark_tables_saved_runs_without_training_and_refuses_when_none_is_saved(
    bench, tmp_path, monkeypatch, capsys
):
    """``--saved-only`` tables runs trained elsewhere (a GPU machine's) whatever code fingerprint they
    carry, and says how many of the runs asked for it found."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for kind, exploded in (("failing", 300), ("control", None)):
        run = dataclasses.replace(_run(kind, {"m": 100}, exploded), failure="attention_logit_growth", monitor_code="x")
        (runs / f"attention_logit_growth-{kind}-0.json").write_text(json.dumps(run.as_dict()))
    common = ["monitors.py", "--failures", "attention_logit_growth", "--seeds", "2", "--policies=", "--saved-only"]
    monkeypatch.setattr("sys.argv", [*common, "--runs", str(runs), "--out", str(tmp_path / "out.json")])
    bench.main()
    assert "2 of the 4 runs asked for are saved" in capsys.readouterr().out
    results = json.loads((tmp_path / "out.json").read_text())
    assert results["monitor_codes"] == {"x": 2} and len(results["runs"]) == 2
    orphan = dataclasses.replace(_run("failing", {}, 300), failure="attention_logit_growth", seed=1, policy="rollback")
    (runs / "attention_logit_growth-failing-1-rollback.json").write_text(json.dumps(orphan.as_dict()))
    guarded = [
        *common[:-2],
        "--policies=rollback",
        "--saved-only",
        "--runs",
        str(runs),
        "--out",
        str(tmp_path / "g.json"),
    ]
    monkeypatch.setattr("sys.argv", guarded)
    bench.main()  # a guarded run without its unguarded twin is left out, not a KeyError
    assert "3 of the 8 runs asked for are saved" in capsys.readouterr().out
    assert json.loads((tmp_path / "g.json").read_text())["actions"] == []
    capped = dataclasses.replace(_run("failing", {}, None), failure="attention_logit_growth", policy="rollback-once")
    capped.actions = [
        {"step": 100, "action": "rollback", "what": "", "by": ["m"], "lr_scale": 0.5},
        {"step": 100, "action": "backoff", "what": "", "by": ["m"], "lr_scale": 0.5},
        {"step": 250, "action": "ignored", "what": "", "by": ["m"], "lr_scale": 0.5},
    ]
    (runs / "attention_logit_growth-failing-0-rollback-once.json").write_text(json.dumps(capped.as_dict()))
    once = [*common[:-2], "--policies=rollback-once", "--saved-only", "--runs", str(runs), "--seed-list", "0"]
    monkeypatch.setattr("sys.argv", [*once, "--out", str(tmp_path / "c.json")])
    bench.main()
    row = json.loads((tmp_path / "c.json").read_text())["guarded_runs"][0]
    assert (row["seed"], row["failed_unguarded"], row["acted"], row["ignored"]) == (0, 300, [100], [250])
    assert "| 0 | rollback-once | 300 | 100 | 250 |" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", [*once[:-1], "0,x", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit) as refused:
        bench.main()
    assert refused.value.code == 2 and "--seed-list" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", [*common, "--runs", str(tmp_path / "none"), "--out", str(tmp_path / "no.json")])
    with pytest.raises(SystemExit) as refused:
        bench.main()
    assert refused.value.code == 2 and "none of the 4 runs" in capsys.readouterr().err
    assert not (tmp_path / "no.json").exists()


def test_a_held_out_set_twins_its_failed_runs_and_caps_those_that_rolled_back_twice(
    bench, tmp_path, monkeypatch, capsys
):
    """``--only-if`` reads the runs saved before the twins: ``failed`` twins only the failing runs
    that failed, ``rolled-back-twice`` caps only those whose rollback twin rolled back more than once.
    Nothing to twin writes nothing; a failed run without its rollback twin is refused, not skipped."""
    from rksp_cli.monitors.failures import monitor_code

    runs, code = tmp_path / "runs", monitor_code()  # today's code: the saved twin is read, not retrained
    runs.mkdir()

    def save(run: WatchedRun) -> None:
        suffix = f"-{run.policy}" if run.policy else ""
        (runs / f"attention_logit_growth-failing-{run.seed}{suffix}.json").write_text(json.dumps(run.as_dict()))

    for seed, exploded in ((0, 300), (1, None)):
        run = dataclasses.replace(_run("failing", {"m": 100}, exploded), seed=seed, monitor_code=code)
        save(dataclasses.replace(run, failure="attention_logit_growth"))
    twin = dataclasses.replace(_run("failing", {"m": 100}, None), failure="attention_logit_growth", monitor_code=code)
    twin.policy = "rollback"
    twin.actions = [
        {"step": 100, "action": "rollback", "what": "", "by": ["m"], "lr_scale": 1.0},
        {"step": 100, "action": "backoff", "what": "", "by": ["m"], "lr_scale": 0.5},
    ]
    save(twin)
    argv = ["monitors.py", "--failures", "attention_logit_growth", "--seeds", "2", "--kinds", "failing"]
    argv += ["--guarded-only", "--runs", str(runs)]
    monkeypatch.setattr("sys.argv", [*argv, "--policies=rollback", "--only-if", "failed", "--out", str(tmp_path / "a")])
    bench.main()
    assert "--only-if failed: 1 run(s): attention_logit_growth 0\n" in capsys.readouterr().out
    results = json.loads((tmp_path / "a").read_text())
    assert results["seeds"] == [0] and [(r["seed"], r["acted"]) for r in results["guarded_runs"]] == [(0, [100])]
    once = [*argv, "--policies=rollback-once", "--only-if", "rolled-back-twice", "--out", str(tmp_path / "b")]
    monkeypatch.setattr("sys.argv", once)
    bench.main()  # rolled back once: nothing to cap
    assert "0 run(s): none" in capsys.readouterr().out and not (tmp_path / "b").exists()
    runner = bench.Runner(runs)
    first, second = (runner.read(("attention_logit_growth", "failing", seed, None)) for seed in (0, 1))
    twin.actions.append({"step": 250, "action": "rollback", "what": "", "by": ["m"], "lr_scale": 0.5})
    save(twin)
    assert bench.asked_for(runner, first, "rolled-back-twice")
    assert not bench.asked_for(runner, second, "rolled-back-twice")  # it did not fail: never twinned
    (runs / "attention_logit_growth-failing-0-rollback.json").unlink()
    with pytest.raises(SystemExit, match=r"no saved rollback twin attention_logit_growth-failing-0-rollback\.json"):
        bench.asked_for(runner, first, "rolled-back-twice")
    monkeypatch.setattr("sys.argv", [a for a in once if a != "--guarded-only"])
    with pytest.raises(SystemExit) as refused:
        bench.main()
    assert refused.value.code == 2 and "--only-if: only with --guarded-only" in capsys.readouterr().err


def test_the_benchmark_refuses_a_guarded_run_that_is_not_its_unguarded_run_s_twin(bench, tmp_path, monkeypatch):
    """A guarded run trains bit for bit as its unguarded twin until the guard first acts; one whose
    losses part before that (trained on another CPU) is refused, naming the step, and nothing is
    written. Saved runs are read as ``--guarded-only`` reads them after training its twins."""
    plain = dataclasses.replace(_run("failing", {}, 300), failure="attention_logit_growth")
    guarded = dataclasses.replace(plain, policy="rollback", exploded_step=None, losses=[1.0] * 400)
    guarded.actions = [{"step": 120, "action": "rollback", "what": "", "by": ["m"], "lr_scale": 0.5}]
    assert bench.twin_parted(plain, guarded) is None
    guarded.losses = [*guarded.losses[:120], 2.0, *guarded.losses[121:]]  # after the guard acted: still twins
    assert bench.twin_parted(plain, guarded) is None
    guarded.losses[7] = 1.0 + 5e-7  # round-off of another CPU, before it acted
    assert bench.twin_parted(plain, guarded) == 7
    runs = tmp_path / "runs"
    runs.mkdir()
    for run in (plain, guarded):
        suffix = f"-{run.policy}" if run.policy else ""
        (runs / f"attention_logit_growth-failing-0{suffix}.json").write_text(json.dumps(run.as_dict()))
    out = tmp_path / "actions.json"
    argv = ["monitors.py", "--failures", "attention_logit_growth", "--seed-list", "0", "--kinds", "failing"]
    argv += ["--policies=rollback", "--saved-only", "--runs", str(runs), "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as refused:
        bench.main()
    assert "step 7" in str(refused.value.code) and "not twins" in str(refused.value.code)
    assert not out.exists()


def _guarded(policy: str, alarms: list[int], steps: int = 30, **kwargs):
    from rksp_cli.monitors.guard import Guard

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    guard = Guard(model, optimizer, policy, scheduler, monitor=AlarmsAt(alarms), **kwargs)
    history, data = [], torch.Generator().manual_seed(1)
    for step in range(steps):
        loss = (model(torch.randn(8, 4, generator=data)) - 1).square().mean()
        optimizer.zero_grad()
        loss.backward()
        guard.step(step, loss)
        before = model.weight.detach().clone()
        if not guard.skip_update:
            optimizer.step()
        scheduler.step()
        history.append((before, model.weight.detach().clone(), optimizer.param_groups[0]["lr"]))
    return guard, history


def test_skip_policy_skips_exactly_the_alarmed_updates():
    guard, history = _guarded("skip", [7, 12])
    unchanged = [s for s, (before, after, _) in enumerate(history) if torch.equal(before, after)]
    assert unchanged == [7, 12] and [a["step"] for a in guard.actions] == [7, 12]
    assert {lr for *_, lr in history} == {0.1}


def test_backoff_halves_the_lr_per_alarm_through_the_scheduler_down_to_the_floor():
    guard, history = _guarded("backoff", [3, 4, 5, 6], floor=0.2)
    lrs = [lr for *_, lr in history]
    assert lrs[2] == 0.1 and lrs[3] == pytest.approx(0.05) and lrs[4] == pytest.approx(0.025)
    assert lrs[-1] == pytest.approx(0.02)  # floored at 20% of the original, the scheduler kept the cut
    assert [a["action"] for a in guard.actions] == ["backoff"] * 3


def test_rollback_restores_the_older_snapshot_and_backs_off():
    guard, history = _guarded("rollback", [23], snapshot_every=10)
    snapshot_10 = history[9][1]  # the weights after step 9 are those seen at step 10
    assert torch.equal(history[23][1], snapshot_10)  # restored, and this step's update skipped
    assert history[23][2] == pytest.approx(0.05)
    assert guard.actions[0]["action"] == "rollback" and "step 10" in guard.actions[0]["what"]
    assert guard.monitor.restores == 1  # told, so that no monitor measures change across the restore
    assert guard.monitor.restored_snapshot == {"fake": 0}  # with the monitors' state taken at step 10


def test_max_actions_acts_on_the_first_alarms_only_and_records_the_rest():
    capped, history = _guarded("rollback", [15, 23, 27], snapshot_every=5, max_actions=1)
    uncapped, twin = _guarded("rollback", [15, 23, 27], snapshot_every=5)
    assert [(a["step"], a["action"]) for a in capped.actions] == [
        (15, "rollback"), (15, "backoff"), (23, "ignored"), (27, "ignored"),
    ]  # fmt: skip
    assert capped.exhausted and not uncapped.exhausted and capped.monitor.restores == 1
    assert all(torch.equal(h[1], t[1]) for h, t in zip(history[:23], twin[:23], strict=True))  # same until the cap
    assert not torch.equal(history[-1][1], twin[-1][1]) and history[-1][2] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="max_actions"):
        _guarded("skip", [], max_actions=0)


def test_optimizer_hook_runs_the_monitors_after_every_step_and_reports_metrics():
    from rksp_cli.monitors import Monitor
    from rksp_cli.monitors.hooks import watch_optimizer

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reported, last = [], {}
    monitor = Monitor(model, every=2)
    handle = watch_optimizer(
        optimizer, monitor, loss=lambda: last.get("loss"), on_metrics=lambda s, m, a: reported.append((s, m))
    )
    ids = torch.randint(0, 103, (4, 16))
    for _ in range(5):
        _, loss = model(ids, ids)
        last["loss"] = float(loss.detach())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    handle.remove()
    optimizer.step()  # removed: no more checks
    assert [s for s, _ in reported] == [0, 2, 4]
    assert "attn_logit_max" in reported[-1][1] and math.isfinite(reported[-1][1]["r_metric"])


def _lightning(tmp_path, callbacks: list, scheduled: bool = False):
    """A tiny GPT in a LightningModule, its loader and a quiet 5-step Trainer."""
    import pytorch_lightning as pl  # in the dev extra, so never skipped

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = GPT(GPTConfig(n_layers=1))

        def training_step(self, batch, batch_idx):
            return self.model(batch[0], batch[0])[1]

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
            if not scheduled:
                return optimizer
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randint(0, 103, (24, 16)))
    trainer = pl.Trainer(max_steps=5, callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    return Module, torch.utils.data.DataLoader(data, batch_size=4), trainer


def test_lightning_callback_logs_metrics_to_the_trainer_and_can_stop_on_an_alarm(tmp_path):
    from rksp_cli.monitors.lightning import RkspMonitor

    callback = RkspMonitor(every=2)
    Module, loader, trainer = _lightning(tmp_path, [callback])
    trainer.fit(Module(), loader)
    assert "rksp/attn_logit_max" in trainer.callback_metrics and "rksp/r_metric" in trainer.callback_metrics
    assert "spectral_alignment" in callback.monitor.names  # found the GPT inside the LightningModule

    stopper = RkspMonitor(every=1, stop_on_alarm=True)
    stopper.on_fit_start(None, Module())
    stopper.monitor.step = lambda step, loss: [Alert(step, "fake", None, 1.0, 0.5, "alarm", "test")]
    _, _, trainer = _lightning(tmp_path, [])
    stopper.on_before_optimizer_step(trainer, Module(), None)
    assert trainer.should_stop and stopper.alerts


def test_output_logits_alarm_when_log_z_keeps_running_away_and_not_when_it_settles():
    def alarms(scale_per_check: float) -> list[Alert]:
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layers=1))
        monitor = OutputLogits(model.head)
        ids = torch.randint(0, 103, (2, 16))
        found = []
        with torch.no_grad():
            for step in range(20):
                model(ids)
                found += monitor.check(step)[1]
                model.head.weight.mul_(scale_per_check)
        return found

    running = alarms(1.5)  # the logits' scale, and so log Z, grows 1.5x a check
    assert running and running[0].monitor == "output_logits" and running[0].value >= 10
    assert alarms(1.0) == []


def test_a_guarded_run_is_judged_on_how_it_ended():
    curve = _curve(3.0, None, n=1300)
    relearned = curve[:700] + curve[:1300]  # rolled back at step 700 to the state of step 0, learned again
    late = curve[:700] + curve[:300]  # rolled back, and the run ended before it had learned again
    runs = [_run("failing", {}, None, n=len(c)) for c in (relearned, late)]
    for run, losses in zip(runs, (relearned, late), strict=True):
        run.losses = losses
    assert runs[0].failed_step is not None  # the jump back is a loss of progress when it happens...
    assert not runs[0].ended_failed and runs[1].ended_failed  # ...and saved only if learned again by the end
    assert _run("failing", {}, exploded=50).ended_failed


def test_growth_alarm_fires_over_a_history_that_held_zeros():
    from rksp_cli.monitors.base import GrowthAlarm

    alarm = GrowthAlarm("m", "signal", level=10.0, lag=3, patience=1)
    fired = [alarm.update(step, None, value) for step, value in enumerate([0.0, 0.0, 0.0, 20.0])]
    assert fired[:3] == [None] * 3 and "infx" in fired[3].reason


def test_lightning_callback_backs_off_the_lr_through_the_trainer_s_scheduler_up_to_its_cap(tmp_path, monkeypatch):
    from rksp_cli.monitors import Monitor
    from rksp_cli.monitors.lightning import RkspMonitor

    real = Monitor.step
    monkeypatch.setattr(Monitor, "step", lambda self, step, loss=None: real(self, step, loss) + (
        [Alert(step, "fake", None, 1.0, 0.5, "alarm", "test")] if step in (2, 3) else []))  # fmt: skip
    callback = RkspMonitor(every=1, policy="backoff", max_actions=1)
    Module, loader, trainer = _lightning(tmp_path, [callback], scheduled=True)
    trainer.fit(Module(), loader)
    assert [(a["step"], a["action"]) for a in callback.actions] == [(2, "backoff"), (3, "ignored")]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(5e-4)  # the scheduler kept the cut
    with pytest.raises(ValueError, match="policy"):
        RkspMonitor(policy="panic")


def test_watch_run_trains_a_failure_s_spec_with_its_fault_and_guard():
    from rksp_cli.monitors.failures import Failure, watch_run

    short = {"training.steps": 30, "training.warmup_steps": 0, "model.n_layers": 1, "training.lr": 0.01}
    failure = Failure("tiny", "test", failing=short, controls={"control": short}, low_precision_bits=3)
    failing = watch_run(failure, "failing", seed=0, every=5, policy="backoff")
    control = watch_run(failure, "control", seed=0, every=5)
    assert len(failing.losses) == len(control.losses) == 30 and failing.policy == "backoff"
    assert failing.losses != control.losses  # the same spec: only the failing run's attention rounds
    assert "attention_logits" in failing.monitors and set(failing.check_seconds) == set(failing.monitors)
    assert failing.step_seconds > 0 and math.isfinite(failing.final_loss)
    assert WatchedRun.from_dict(failing.as_dict()).first_alarms() == failing.first_alarms()
    # every check's metrics are kept, so alarm rules can be replayed on the signal afterwards
    assert [c["step"] for c in failing.series] == list(range(0, 30, 5))
    assert all("attn_logit_max" in c["metrics"] for c in failing.series)
    with pytest.raises(ValueError, match="kind"):
        watch_run(failure, "clean", seed=0)


def test_every_failure_s_control_is_the_same_run_with_one_change():
    """A control shares the failing run's model, task and length; one field (or the fault) differs."""
    from rksp_cli.monitors.failures import FAILURES, GPU_FAILURES

    for failure in (*FAILURES.values(), *GPU_FAILURES.values()):
        assert failure.kinds[0] == "failing" and "control" in failure.kinds
        for kind, changes in failure.controls.items():
            failing, control = failure.spec("failing", 0), failure.spec(kind, 0)
            assert failing.training.steps == control.training.steps, (failure.name, kind)
            fields = failure.failing.keys() | changes.keys()
            changed = {k for k in fields if failure.failing.get(k) != changes.get(k)}
            assert len(changed) + bool(failure.low_precision_bits) == 1, (failure.name, kind, changed)


def test_a_control_that_changes_the_architecture_has_one_that_keeps_it():
    """Deep Post-LN's first control is Pre-LN: its second keeps Post-LN and lowers the lr alone, so that
    false alarms are counted on healthy runs of the failing architecture too."""
    from rksp_cli.monitors.failures import FAILURES

    post_ln = FAILURES["post_ln_without_warmup"]
    same = post_ln.spec("control_low_lr", 0)
    assert same.model.norm == post_ln.spec("failing", 0).model.norm == "post"
    assert same.training.lr < post_ln.spec("failing", 0).training.lr
    with pytest.raises(ValueError, match="control_low_lr"):
        FAILURES["attention_logit_growth"].spec("control_low_lr", 0)  # only where the control changes the norm


def test_monitor_code_hashes_the_lines_of_code_not_the_syntax_tree():
    """The text hashed is the code's own lines, so it is the same under every Python version (a
    syntax tree's dump is not); a '#' inside a string is code, not a comment."""
    from rksp_cli.monitors.failures import _code_lines

    source = 'def f(x):\n    """Why."""\n\n    return x + 1  # because\n\n\nTAG = "#1"  # kept\n'
    assert _code_lines(source) == 'def f(x):\n    return x + 1\nTAG = "#1"'


def test_monitor_code_ignores_docstrings_and_comments_but_not_a_changed_rule(tmp_path):
    import shutil
    from pathlib import Path

    from rksp_cli.monitors import attention_logits
    from rksp_cli.monitors.failures import monitor_code

    package = Path(attention_logits.__file__).parent
    copy = tmp_path / "monitors"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = monitor_code(copy)
    assert before == monitor_code(package)
    target = copy / "attention_logits.py"
    source = target.read_text()
    reworded = source.replace('"""Attention-logit growth', '"""Reworded: attention-logit growth')
    assert reworded != source
    target.write_text(reworded + "# a comment\n")
    assert monitor_code(copy) == before
    target.write_text(reworded.replace("\n\n", "\n\n\n", 1))  # a blank line more
    assert monitor_code(copy) == before
    changed = source.replace("LEVEL, GROWTH, LAG = 150.0,", "LEVEL, GROWTH, LAG = 100.0,")
    assert changed != source
    target.write_text(changed)
    assert monitor_code(copy) != before
