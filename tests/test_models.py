"""The built-in GPT and the residual-stream capture."""

import pytest
import torch

from rksp_cli.capture import capture_residual_stream, sample_positions
from rksp_cli.models.gpt import GPT, NORMS, GPTConfig
from rksp_cli.models.norm import NormFinder, centres


@pytest.mark.parametrize("norm", NORMS)
def test_init_follows_the_contract(norm):
    torch.manual_seed(0)
    model = GPT(GPTConfig(norm=norm, d_model=64, n_layers=2, init_std=0.05))
    assert model.tok_emb.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert model.blocks[0].attn.qkv.bias.abs().max() == 0
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
    assert all(torch.all(n.weight == 1) for n in norms)
    assert (len(norms) == 0) == (norm == "none")
    logits, loss = model(torch.randint(0, 103, (2, 16)), torch.randint(0, 103, (2, 16)))
    assert logits.shape == (2, 16, 103) and torch.isfinite(loss)


def test_deepnorm_and_subln_scale_the_branch_weights_as_their_papers_do():
    torch.manual_seed(0)
    plain = GPT(GPTConfig(norm="post", d_model=64, n_layers=4, init_std=0.02))
    torch.manual_seed(0)
    deep = GPT(GPTConfig(norm="deepnorm", d_model=64, n_layers=4, init_std=0.02))
    beta = (8 * 4) ** -0.25
    assert torch.equal(deep.blocks[0].mlp.fc.weight, plain.blocks[0].mlp.fc.weight * beta)
    assert torch.equal(deep.blocks[0].attn.qkv.weight[:128], plain.blocks[0].attn.qkv.weight[:128])  # q, k untouched
    assert deep.blocks[0].alpha == pytest.approx(8**0.25)


def test_zero_init_residual_makes_every_pre_norm_block_the_identity():
    model = GPT(GPTConfig(norm="pre", zero_init_residual=True)).eval()
    x = torch.randn(2, 8, 64)
    assert torch.equal(model.blocks[0](x), x)


def test_capture_reads_embeddings_and_block_outputs_before_the_final_norm():
    torch.manual_seed(0)
    model = GPT(GPTConfig(norm="pre", n_layers=3)).eval()
    ids = torch.randint(0, 103, (4, 32))
    positions = sample_positions(ids.numel(), 100, torch.Generator().manual_seed(0))
    states = capture_residual_stream(model.blocks, lambda: model(ids), positions).states
    assert len(states) == 4 and states[0].shape == (100, 64) and states[0].dtype == torch.float32  # the model's
    with torch.no_grad():
        h = model.embed(ids)
        assert torch.equal(states[0], h.reshape(-1, 64)[positions])
        for block in model.blocks:
            h = block(h)
    assert torch.equal(states[-1], h.reshape(-1, 64)[positions])
    assert not any(b._forward_hooks or b._forward_pre_hooks for b in model.blocks)  # hooks removed


def test_capture_widens_a_bfloat16_stream_to_float32_exactly():
    torch.manual_seed(0)
    model = GPT(GPTConfig(norm="pre", n_layers=2)).eval().to(torch.bfloat16)
    ids = torch.randint(0, 103, (2, 16))
    states = capture_residual_stream(model.blocks, lambda: model(ids), torch.arange(32)).states
    with torch.no_grad():
        h = model.embed(ids)
    assert states[0].dtype == torch.float32 and torch.equal(states[0], h.reshape(-1, 64).float())


def test_capture_on_transformers_skips_the_final_norm_that_hidden_states_applies():
    from transformers import AutoModel

    from tests.conftest import hf_config

    torch.manual_seed(0)
    model = AutoModel.from_config(hf_config("gpt2")).eval()
    ids = torch.randint(0, 96, (2, 16))
    positions = torch.arange(32)
    capture = capture_residual_stream(model.h, lambda: model(input_ids=ids, output_hidden_states=True), positions)
    states, out = capture.states, capture.result
    hidden = [h.reshape(-1, 32) for h in out.hidden_states]
    for i in range(len(hidden) - 1):  # the very tensors transformers returns
        assert torch.equal(states[i], hidden[i])
    assert not torch.allclose(states[-1], hidden[-1], atol=1e-3)  # transformers' last entry is ln_f(h_L)
    with torch.no_grad():  # the same float32 LayerNorm on the same input: the same bits
        assert torch.equal(model.ln_f(states[-1]), hidden[-1])


def test_sigma_reparam_starts_as_the_plain_init_and_holds_each_spectral_norm_at_gamma():
    torch.manual_seed(0)
    plain = GPT(GPTConfig(n_layers=2))
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=2, sigma_reparam=True))
    ids = torch.randint(0, 103, (2, 16))
    # one power-iteration step from the exact singular vector: equal to float32 round-off
    assert torch.allclose(model(ids)[0], plain(ids)[0], rtol=0, atol=1e-5)
    qkv = model.blocks[0].attn.qkv
    gamma = qkv.parametrizations.weight[0].gamma
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(20):
        loss = model(ids, ids)[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    sigma = torch.linalg.matrix_norm(qkv.weight.detach(), 2)  # power iteration tracks it step by step
    assert float(sigma) == pytest.approx(float(gamma.detach()), rel=0.05)
    assert gamma.grad is not None and float(loss.detach()) < float(plain(ids, ids)[1].detach())


def test_qk_norm_normalises_each_heads_queries_and_keys_and_leaves_values_alone():
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=64, n_heads=4, n_layers=1, qk_norm=True))
    attn = model.blocks[0].attn
    x = torch.randn(2, 8, 64) * 5
    q, k, v = attn.heads(x)
    assert q.shape == k.shape == v.shape == (2, 4, 8, 16)
    for t in (q, k):  # LayerNorm over the head width, gains one and biases zero at init
        assert torch.allclose(t.mean(-1), torch.zeros(()), atol=1e-5)
        assert torch.allclose(t.var(-1, unbiased=False), torch.ones(()), atol=1e-3)
    plain = GPT(GPTConfig(d_model=64, n_heads=4, n_layers=1))
    plain.load_state_dict(model.state_dict(), strict=False)  # same weights, no q/k norms
    assert torch.equal(plain.blocks[0].attn.heads(x)[2], v)
    assert not torch.allclose(plain.blocks[0].attn.heads(x)[0], q)


# deepnorm is Post-LN with a scaled residual; sub-LN is pre-LN with extra norms inside each branch
SEEN_AS = {"pre": "pre", "post": "post", "rms": "rms", "none": "none", "deepnorm": "post", "subln": "pre"}


@pytest.mark.parametrize("norm", NORMS)
def test_norm_finder_tells_every_built_in_family_from_one_forward_pass(norm):
    torch.manual_seed(0)
    model = GPT(GPTConfig(norm=norm, d_model=32, n_layers=2, n_heads=4, vocab_size=64, seq_len=16)).eval()
    with NormFinder(model.blocks[0]) as finder, torch.no_grad():
        model(torch.randint(0, 64, (2, 16)))
    assert finder.family == SEEN_AS[norm]
    assert not model.blocks[0]._forward_hooks and not model.blocks[0]._forward_pre_hooks  # gone after block 0


@pytest.mark.parametrize(
    ("name", "family"),
    [("gpt2", "pre"), ("llama", "rms"), ("mixtral", "rms"), ("bert", "post"), ("gpt_neox", "pre"), ("mamba", "rms")],
)
def test_norm_finder_on_transformers_models(name, family):
    """LLaMA registers its norms after attention and MLP, so only the order they run in tells."""
    from transformers import AutoModel

    from rksp_cli.models.hf import find_blocks
    from tests.conftest import hf_config

    torch.manual_seed(0)
    config = hf_config(name)
    model = AutoModel.from_config(config).eval()
    _, blocks = find_blocks(model, config.num_hidden_layers)
    with NormFinder(blocks[0]) as finder, torch.no_grad():
        model(input_ids=torch.randint(0, 96, (2, 16)))
    assert finder.family == family


def test_norm_finder_leaves_norms_on_the_branch_outputs_untold():
    """x + norm(f(x)) (OLMo-2's order) is neither pre- nor Post-LN: no family, not a wrong one."""

    class BranchNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.f, self.norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

        def forward(self, x):
            return x + self.norm(self.f(x))

    block = BranchNorm()
    with NormFinder(block) as finder, torch.no_grad():
        block(torch.randn(2, 3, 8))
    assert finder.family is None


def test_norm_finder_tells_rmsnorm_from_layernorm_by_centring_not_by_name():
    class Norm(torch.nn.Module):  # named like neither
        def __init__(self, centre: bool):
            super().__init__()
            self.centre = centre

        def forward(self, x):
            x = x - x.mean(-1, keepdim=True) if self.centre else x
            return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)

    for centre in (True, False):
        assert centres(Norm(centre), torch.randn(4, 16)) is centre
