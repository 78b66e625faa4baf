"""Koopman Spectral Shaping: differentiable, safe at repeated eigenvalues, and it shapes spectra."""

import torch
from torch import nn

from rksp_cli.kss import KoopmanSpectralShaping
from rksp_cli.models.gpt import GPT, GPTConfig


def _train_step(model: GPT, kss: KoopmanSpectralShaping, step: int) -> torch.Tensor:
    ids = torch.randint(0, 103, (8, 32), generator=torch.Generator().manual_seed(step))
    _, loss = model(ids, ids)
    return loss + kss(step)


def test_penalty_flows_into_the_model_weights_on_schedule_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig(norm="none", n_layers=2))
    kss = KoopmanSpectralShaping(model.blocks, every=10, rank=16)
    ids = torch.randint(0, 103, (8, 32))
    model(ids)
    term = kss(10)
    assert term.requires_grad and term.item() > 0
    term.backward()
    assert model.blocks[0].mlp.fc.weight.grad.abs().sum() > 0 or model.blocks[1].mlp.fc.weight.grad.abs().sum() > 0
    model(ids)
    assert kss(11).item() == 0.0  # off schedule: nothing, and the stored states are dropped
    kss.remove()


def test_repeated_eigenvalues_never_put_nan_into_gradients():
    model = GPT(GPTConfig(norm="pre", n_layers=2, zero_init_residual=True))  # every block the identity
    kss = KoopmanSpectralShaping(model.blocks, every=1, fraction=1.0, rank=16)
    loss = _train_step(model, kss, 0)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_minimising_the_penalty_pulls_an_expansive_operator_inside_the_unit_circle():
    torch.manual_seed(0)
    d = 8
    A = nn.Parameter(torch.eye(d) * 1.3 + 0.05 * torch.randn(d, d))
    block = nn.Linear(d, d, bias=False)
    kss = KoopmanSpectralShaping([block], every=1, fraction=1.0, rank=d, alpha=1.0, max_grad=10.0)
    opt = torch.optim.Adam([A], lr=0.02)
    x = torch.randn(512, d)

    def radius() -> float:
        return torch.linalg.eigvals(A.detach()).abs().max().item()

    before = radius()
    for step in range(200):
        block.weight = A  # the hooked module computes y = A x with the parameter being shaped
        block(x)
        opt.zero_grad()
        kss(step).backward()
        opt.step()
    assert before > 1.2 and radius() < 1.1


def test_growth_variant_pulls_a_non_normal_operator_s_largest_singular_value_to_one():
    """Eigenvalues inside the unit circle, yet one application amplifies by 3: the published
    penalty sees nothing to fix, the growth variant shrinks sigma_max towards tau_u."""
    torch.manual_seed(0)
    d = 8
    A = nn.Parameter(0.5 * torch.eye(d) + torch.diag(torch.full((d - 1,), 3.0), 1))  # nilpotent part
    x = torch.randn(512, d)
    block = nn.Linear(d, d, bias=False)

    paper = KoopmanSpectralShaping([block], every=1, fraction=1.0, rank=d, alpha=1.0)
    block.weight = A
    block(x)
    assert float(paper(0).detach()) <= paper.beta * paper.gamma**2 + 1e-6  # every |lambda| 0.5: m_soft alone
    paper.remove()
    kss = KoopmanSpectralShaping([block], every=1, fraction=1.0, rank=d, alpha=1.0, variant="growth", max_grad=10.0)
    opt = torch.optim.Adam([A], lr=0.02)
    sigma = lambda: float(torch.linalg.matrix_norm(A.detach(), 2))  # noqa: E731
    before = sigma()
    for step in range(300):
        block.weight = A
        block(x)
        opt.zero_grad()
        kss(step).backward()
        opt.step()
    assert before > 3 and sigma() < 1.3


def test_works_on_transformers_blocks():
    from transformers import AutoModel

    from tests.conftest import hf_config

    torch.manual_seed(0)
    model = AutoModel.from_config(hf_config("llama"))
    kss = KoopmanSpectralShaping(model.layers, every=1, fraction=1.0, rank=16)
    out = model(input_ids=torch.randint(0, 96, (4, 32)))
    (out.last_hidden_state.square().mean() + kss(0)).backward()
    grads = [p.grad for p in model.layers.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_autocast_leaves_the_eigen_decomposition_in_float64():
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = x @ (0.9 * torch.eye(16) + 0.05 * torch.randn(16, 16))
    exact = KoopmanSpectralShaping([nn.Identity()], rank=8, seed=3).eigenvalues(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = KoopmanSpectralShaping([nn.Identity()], rank=8, seed=3).eigenvalues(x, y)
    assert mixed.dtype == torch.complex128
    assert torch.equal(mixed, exact)  # the same float64 operations: autocast reached none of them


def test_hugging_face_trainer_trains_with_the_penalty_on_schedule(tmp_path):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from rksp_cli.hf_trainer import attach_kss
    from tests.conftest import hf_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("llama"))
    ids = torch.randint(0, 96, (16, 32), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, seed=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=data)
    kss = attach_kss(trainer, every=2, fraction=1.0, rank=8)
    trainer.train()
    assert kss.applied == 2 and kss.skipped == 0  # steps 0 and 2
    assert all(torch.isfinite(p).all() for p in model.parameters())
    model(input_ids=ids[:2])
    assert not kss._states  # hooks removed when training ended


def test_kss_shapes_the_very_eigenvalues_the_screen_reports_at_its_rank():
    """One DMD core: KSS's rank-r operator is the screen's `probe.rank: r` estimator."""
    from rksp_cli.koopman import DMDSettings, layer_spectrum
    from tests.tolerances import eigenvalue_tolerance

    torch.manual_seed(0)
    x = torch.randn(512, 24, dtype=torch.float64) * torch.logspace(-1, 0, 24, dtype=torch.float64)
    y = x + torch.tanh(x @ (0.3 * torch.randn(24, 24, dtype=torch.float64)))
    shaped = KoopmanSpectralShaping([nn.Identity()], rank=8, seed=3).eigenvalues(x, y)
    screened = layer_spectrum(x.T, y.T, DMDSettings(rank=8, kappa=True))
    # KSS adds a 1e-9 diagonal jitter (separating repeated eigenvalues): it moves each by <= kappa(V) 1e-9;
    # kappa(X) = 10 by construction (the columns' scales span one decade)
    tol = screened.kappa * 1e-9 + eigenvalue_tolerance(24, screened.kappa, 10.0, screened.spectral_radius)
    distance = (shaped[:, None] - screened.eigenvalues[None, :]).abs()
    assert float(distance.min(1).values.max()) < tol and float(distance.min(0).values.max()) < tol
