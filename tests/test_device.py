"""``--device cuda``: the same numbers as the CPU, within what the problem's conditioning allows.

Runs only where CUDA exists (CI has none; the benchmark machine's GPU ran it, see the README).
"""

import math

import pytest
import torch

from rksp_cli.koopman import DMDSettings, layer_spectrum
from rksp_cli.models import BuildOptions
from rksp_cli.probe import probe
from rksp_cli.screen import screen
from rksp_cli.spec import spec_from_dict
from tests.test_koopman import _max_matching_distance, _snapshots
from tests.tolerances import condition, eigenvalue_tolerance, float32_solve_tolerance

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_the_dmd_of_the_same_states_matches_the_cpu_within_its_conditioning():
    X, Y = _snapshots(d=24, n=600)
    cpu = layer_spectrum(X, Y, DMDSettings(kappa=True))
    gpu = layer_spectrum(X.cuda(), Y.cuda(), DMDSettings(kappa=True))
    norm_a = cpu.spectral_radius
    # two backward-stable solves of one problem: twice the bound of either against the exact one
    tol = 2 * (eigenvalue_tolerance(24, cpu.kappa, condition(X - X.mean(1, keepdim=True)), norm_a)
               + float32_solve_tolerance(24, cpu.kappa, norm_a))  # fmt: skip
    assert _max_matching_distance(gpu.eigenvalues.cpu(), cpu.eigenvalues) < tol
    assert gpu.eta_nl == pytest.approx(cpu.eta_nl, rel=1e-6)


def test_a_cuda_screen_reads_the_features_of_the_cpu_screen():
    spec = spec_from_dict({"model": {"n_layers": 3, "norm": "pre"}, "probe": {"tokens": 512}})
    cpu = screen(spec).features
    gpu = screen(spec, options=BuildOptions(device="cuda")).features
    # float32 forward passes on two devices differ by round-off (~1e-6 relative); an eigenvalue
    # within that of a band edge can change band, which moves a mass by one eigenvalue in d
    one_eigenvalue = 1 / spec.model.d_model
    for name in ("near_unit_mass_mean", "expansive_mass_mean", "contractive_mass_mean"):
        assert gpu[name] == pytest.approx(cpu[name], abs=one_eigenvalue + 1e-9), name
    for name in ("spectral_radius_mean", "eta_nl_mean", "stream_growth", "init_loss"):
        assert gpu[name] == pytest.approx(cpu[name], rel=1e-4), name


@pytest.mark.parametrize(("norm", "lr", "diverges"), [("pre", 1e-3, False), ("none", 0.3, True)])
def test_a_cuda_probe_labels_clear_cases_as_the_cpu_does(norm, lr, diverges):
    spec = spec_from_dict({"model": {"n_layers": 2, "norm": norm}, "training": {"lr": lr, "steps": 60},
                           "probe": {"tokens": 256}})  # fmt: skip
    gpu = probe(spec, device="cuda")
    assert gpu.diverged is diverges
    assert gpu.losses[0] == pytest.approx(probe(spec).losses[0], rel=1e-4)  # same init, same first batch


def test_every_monitor_and_a_guard_watch_a_cuda_run_as_they_watch_a_cpu_run():
    from rksp_cli.monitors.failures import Failure, watch_run

    short = {"training.steps": 30, "training.warmup_steps": 0, "model.n_layers": 2, "model.n_experts": 4,
             "training.lr": 0.01}  # fmt: skip
    failure = Failure("tiny", "test", failing=short, controls={"control": short}, low_precision_bits=3)
    gpu, cpu = (watch_run(failure, "control", seed=0, every=5, device=d) for d in ("cuda", "cpu"))
    assert gpu.monitors == cpu.monitors and "router" in gpu.monitors
    # the first check sees the same init and batch, so the smooth metrics agree to round-off (float32
    # on two devices, a few power iterations); entropies of histograms, condition numbers and the
    # R-Metric's step times are left out: a value on a bin edge or a timer may differ
    smooth = ("sa_sigma1/", "sublayer_ratio/", "attn_logit_max", "log_z_mean", "router_entropy/", "router_norm/")
    first_gpu, first_cpu = gpu.series[0]["metrics"], cpu.series[0]["metrics"]
    compared = [k for k in first_cpu if k.startswith(smooth)]
    assert len(compared) > 10
    for name in compared:
        assert first_gpu[name] == pytest.approx(first_cpu[name], rel=1e-3), name
    # the low-precision fault and a rollback guard run on the GPU's tensors
    guarded = watch_run(failure, "failing", seed=0, every=5, policy="rollback", device="cuda")
    assert len(guarded.losses) == 30 and all(math.isfinite(x) for x in guarded.losses)


def test_the_r_metric_reads_the_gpu_s_fault_counters_through_nvml():
    pytest.importorskip("pynvml")
    from rksp_cli.monitors.r_metric import HardwareEvents

    events = HardwareEvents()
    assert events.nvml is not None  # NVML answered: the counters, not stragglers alone
    assert events.take() >= 0
