"""The screen pipeline end to end, as a library."""

import math

import pytest
import torch

from rksp_cli.errors import InputError, UnassessableError
from rksp_cli.models import BuildOptions
from rksp_cli.risk import RuleBasedRisk
from rksp_cli.screen import screen
from rksp_cli.spec import spec_from_dict
from tests.conftest import HF_CONFIGS, hf_config


def _screen(model: dict, probe: dict | None = None, **kwargs):
    return screen(spec_from_dict({"model": model, "probe": {"tokens": 512, **(probe or {})}}), **kwargs)


def test_norm_ordering_matches_paper_table_1():
    """Paper: layer-mean M~1 is 0.80 (none) > 0.66 (post) > 0.16 (pre), at N = 2048 token states."""
    mass = {}
    for norm in ("none", "post", "pre"):
        spec = spec_from_dict({"model": {"norm": norm}, "probe": {"tokens": 2048}})
        mass[norm] = screen(spec).features["near_unit_mass_mean"]
    assert mass["none"] > mass["post"] > mass["pre"]
    assert mass["none"] > 0.5 > mass["pre"]


def test_same_config_gives_the_same_numbers_and_the_seed_matters():
    a = _screen({"norm": "pre", "d_model": 32, "n_heads": 4})
    b = _screen({"norm": "pre", "d_model": 32, "n_heads": 4})
    c = _screen({"norm": "pre", "d_model": 32, "n_heads": 4}, {"seed": 1})
    assert a.features == b.features
    assert a.features != c.features


def test_identity_blocks_cannot_be_assessed():
    with pytest.raises(UnassessableError, match="identity"):
        _screen({"norm": "pre", "zero_init_residual": True})


def test_large_init_is_not_read_as_safe():
    """Method reference 2.1, weakness 5: a large init scale lowers M~1 while the run explodes."""
    for risk_model in (RuleBasedRisk(), None):  # the rule and the shipped calibration alike
        result = _screen({"norm": "none", "init_std": 0.5}, {"tokens": 1024}, risk_model=risk_model)
        assert result.features["near_unit_mass_mean"] < 0.3  # the paper's score would say "safe"
        assert result.risk.verdict == "high"


def test_result_reports_features_layers_and_the_uncalibrated_fallback():
    result = _screen({"norm": "pre", "n_layers": 3}, risk_model=RuleBasedRisk())
    d = result.to_dict()
    assert len(d["layers"]) == 3 and d["features"]["n_layers"] == 3
    assert 0.0 <= d["risk"] <= 1.0 and d["verdict"] in ("low", "elevated", "high")
    assert d["risk_model"]["calibrated"] is False and "not calibrated" in d["risk_model"]["name"]
    assert d["config"]["probe"]["tokens"] == 512
    assert d["features"]["init_loss"] == pytest.approx(torch.log(torch.tensor(103.0)).item(), rel=0.05)


def test_too_few_tokens_for_the_width_uses_the_data_subspace_and_says_so():
    result = _screen({"d_model": 128, "n_heads": 4, "n_layers": 2}, {"tokens": 64})
    assert result.spectra[0].eigenvalues.numel() <= 63
    assert any("data subspace" in w for w in result.warnings)


def test_text_file_input(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    result = _screen({"norm": "pre", "vocab_size": 64}, {"input": str(text)})
    assert result.features["near_unit_mass_mean"] >= 0
    with pytest.raises(InputError, match="distinct characters"):
        _screen({"norm": "pre", "vocab_size": 8}, {"input": str(text)})


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_transformers_architectures_are_screened_block_by_block(name, hf_config_file):
    result = _screen({"hf_config": str(hf_config_file(name))})
    assert len(result.spectra) == hf_config(name).num_hidden_layers
    assert result.model["model_type"] == name
    assert 0.0 <= result.features["near_unit_mass_mean"] <= 1.0


def test_checkpoint_weights_are_what_gets_screened(tmp_path):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(hf_config("gpt2"))
    with torch.no_grad():  # zero the residual branches: random init would never look like this
        for block in model.transformer.h:
            for lin in (block.attn.c_proj, block.mlp.c_proj):
                lin.weight.zero_()
                lin.bias.zero_()
    model.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(UnassessableError):
        _screen({"checkpoint": str(tmp_path / "ckpt")})


def test_directory_sharded_and_bare_safetensors_checkpoints_agree(tmp_path):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(hf_config("gpt2"))
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    features = [
        _screen({"checkpoint": str(tmp_path / "one")}).features,
        _screen({"checkpoint": str(tmp_path / "sharded")}).features,
        _screen({"checkpoint": str(tmp_path / "one" / "model.safetensors")}).features,
    ]
    assert features[1] == pytest.approx(features[0], nan_ok=True)
    assert features[2] == pytest.approx(features[0], nan_ok=True)


def test_pickle_checkpoints_need_explicit_permission(tmp_path):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(hf_config("gpt2"))
    model.config.to_json_file(tmp_path / "config.json")
    torch.save(model.state_dict(), tmp_path / "weights.bin")
    with pytest.raises(InputError, match="--allow-pickle"):
        _screen({"checkpoint": str(tmp_path / "weights.bin")})
    allowed = _screen({"checkpoint": str(tmp_path / "weights.bin")}, options=BuildOptions(allow_pickle=True))
    assert allowed.features["n_layers"] == 2


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_streaming_gives_the_same_features_and_frees_every_block(name, hf_config_file):
    spec = spec_from_dict({"model": {"hf_config": str(hf_config_file(name))}, "probe": {"tokens": 256}})
    whole = screen(spec, options=BuildOptions(stream=False))
    streamed = screen(spec, options=BuildOptions(stream=True))
    assert streamed.model["streamed"] and not whole.model["streamed"]
    assert streamed.features == pytest.approx(whole.features, nan_ok=True)
    assert all(row["materialize"] >= 0 for row in streamed.timings["layers"])
    assert whole.model["norm"] is not None and streamed.model["norm"] == whole.model["norm"]  # freed blocks too


def test_streamed_blocks_return_to_the_meta_device(hf_config_file):
    from rksp_cli.capture import capture_residual_stream
    from rksp_cli.models import build_subject

    spec = spec_from_dict({"model": {"hf_config": str(hf_config_file("llama"))}})
    subject = build_subject(spec.model, seed=0, options=BuildOptions(stream=True))
    assert all(p.is_meta for block in subject.blocks for p in block.parameters())
    ids = torch.randint(0, 96, (2, 16))
    capture_residual_stream(subject.blocks, lambda: subject.forward(ids), torch.arange(8))
    assert all(p.is_meta for block in subject.blocks for p in block.parameters())
    assert not any(p.is_meta for p in subject.module.embed_tokens.parameters())


def test_random_init_follows_the_config_initializer(hf_config_file):
    from rksp_cli.models import build_subject

    spec = spec_from_dict({"model": {"hf_config": str(hf_config_file("llama")), "init_std": 0.1}})
    subject = build_subject(spec.model, seed=0, options=BuildOptions(stream=False))
    weight = subject.blocks[0].mlp.up_proj.weight
    assert weight.std().item() == pytest.approx(0.1, rel=0.1)
    assert subject.blocks[0].input_layernorm.weight.eq(1).all()


def test_streamed_checkpoint_matches_the_whole_checkpoint(tmp_path):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(hf_config("llama")).save_pretrained(tmp_path / "ckpt", max_shard_size="40KB")
    spec = spec_from_dict({"model": {"checkpoint": str(tmp_path / "ckpt")}, "probe": {"tokens": 256}})
    assert screen(spec, options=BuildOptions(stream=True)).features == pytest.approx(
        screen(spec, options=BuildOptions(stream=False)).features, nan_ok=True
    )


def test_an_absent_device_is_an_input_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present here")
    with pytest.raises(InputError, match="--device cuda"):
        BuildOptions(device="cuda")


def test_a_model_without_findable_blocks_names_what_was_tried():
    from torch import nn

    from rksp_cli.models.hf import find_blocks

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.stages = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])

    with pytest.raises(InputError, match=r"num_hidden_layers=4.*stages \(3\)"):
        find_blocks(Odd(), 4)


@pytest.mark.parametrize(
    ("name", "head"),
    [("mixtral", "AutoModelForCausalLM"), ("bert", "AutoModelForMaskedLM"), ("gpt2", "AutoModelForCausalLM")],
)
def test_checkpoints_saved_by_the_installed_transformers_screen(name, head, tmp_path):
    """Per-expert Mixtral names need transformers' key conversion; a BERT MLM checkpoint has no pooler
    (outside the residual stream: initialised, listed, harmless) and a head the screen ignores."""
    import transformers

    torch.manual_seed(0)
    getattr(transformers, head).from_config(hf_config(name)).save_pretrained(tmp_path / name)
    result = _screen({"checkpoint": str(tmp_path / name)}, {"tokens": 256})
    assert len(result.spectra) == 2 and result.model["model_type"] == name
    missing = result.model.get("initialised_not_loaded", [])
    assert all(not key.startswith(result.model["blocks"]) for key in missing)
    if name == "bert":
        assert missing == ["pooler.dense.bias", "pooler.dense.weight"]


def test_a_checkpoint_missing_an_embedding_stops_rather_than_screens_random_inputs(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(hf_config("llama")).save_pretrained(tmp_path / "ckpt")
    weights = load_file(tmp_path / "ckpt" / "model.safetensors")
    del weights["model.embed_tokens.weight"]
    save_file(weights, tmp_path / "ckpt" / "model.safetensors", metadata={"format": "pt"})
    for stream in (False, True):
        with pytest.raises(InputError, match=r"embed_tokens.*feeds the first block"):
            _screen({"checkpoint": str(tmp_path / "ckpt")}, options=BuildOptions(stream=stream))


def test_a_mamba2_config_screens(tmp_path):
    """Its config.json holds {"__float__": "Infinity"}, which only transformers' own reader decodes."""
    from transformers import Mamba2Config

    path = tmp_path / "config.json"
    Mamba2Config(
        hidden_size=64, num_hidden_layers=2, vocab_size=96, state_size=8, num_heads=4, head_dim=32, n_groups=1
    ).to_json_file(path)
    assert "Infinity" in path.read_text()
    result = _screen({"hf_config": str(path)}, {"tokens": 256})
    assert len(result.spectra) == 2 and result.model["model_type"] == "mamba2"


def test_the_cost_estimate_is_checked_before_any_weight_exists():
    """A 10**6-wide GPT is refused from its meta-device shape: nothing is allocated."""
    from rksp_cli.budget import Budget

    spec = spec_from_dict({"model": {"d_model": 1_000_000}})
    with pytest.raises(InputError, match=r"model\.d_model"):
        screen(spec, budget=Budget(memory_bytes=8e9))


def test_the_spread_comes_from_more_token_samples_and_leaves_the_numbers_alone():
    spec = spec_from_dict({"model": {"norm": "pre"}, "training": {"lr": 0.01}, "probe": {"tokens": 512}})
    once, thrice = screen(spec), screen(spec, repeats=3)
    assert once.spread is None
    assert thrice.features == once.features and thrice.risk.risk == once.risk.risk  # sample 0 is the screen
    spread = thrice.spread
    assert spread["samples"] == 3 and len(thrice.samples) == 3 and once.samples == [once.features]
    assert thrice.samples[0] == once.features and thrice.samples[1] != thrice.samples[2]
    low, high = spread["features"]["near_unit_mass_mean"]
    assert low <= once.features["near_unit_mass_mean"] <= high and low < high  # other samples, other numbers
    assert spread["risk"][0] <= once.risk.risk <= spread["risk"][1]
    assert thrice.to_dict()["spread"] == spread


def test_a_long_screen_skips_the_spread_and_says_so():
    spec = spec_from_dict({"training": {"lr": 0.01}, "probe": {"tokens": 256}})
    result = screen(spec, repeats=3, repeats_within=0.0)
    assert result.spread is None and any("spread over token samples not measured" in w for w in result.warnings)
    assert screen(spec, repeats=3).spread["samples"] == 3  # no limit given: measured whatever it costs


def test_an_infinite_kappa_is_reported_not_dropped_silently():
    from rksp_cli.koopman import DMDSettings, layer_spectrum
    from rksp_cli.screen import _warnings

    torch.manual_seed(0)
    X = torch.randn(8, 200, dtype=torch.float64)
    spectra = [layer_spectrum(X, 1.1 * X, DMDSettings()) for _ in range(2)]
    spectra[1].kappa = float("inf")  # what a defective operator reports
    warnings = _warnings(spectra, d=8, n_tokens=200, distinct=200, settings=DMDSettings())
    assert any("κ(V) is infinite" in w and "[1]" in w for w in warnings)
    assert any("below the 2048 token states" in w for w in warnings)  # η_nl reads low on 200 states


def test_distinct_columns_drop_exact_repeats_only_and_keep_order():
    from rksp_cli.screen import _distinct_columns

    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(6, 40, generator=g), torch.randn(6, 40, generator=g)
    X[:, 7], Y[:, 7] = X[:, 3], Y[:, 3]  # a repeat of column 3
    X[:, 9], Y[:, 9] = X[:, 3], Y[:, 3]  # and another
    X[:, 12] = X[:, 5]  # same input, other output: a different transition, kept
    X[:, 20], Y[:, 20] = -X[:, 21] * 0.0, Y[:, 21]  # -0.0 equals 0.0
    X[:, 21] = X[:, 21] * 0.0
    X[:, 30] = X[:, 31]
    X[0, 30] = torch.nextafter(X[0, 31], torch.tensor(1e9))  # one ulp apart: distinct
    Y[:, 30] = Y[:, 31]
    Xd, Yd, kept = _distinct_columns(X, Y)
    assert kept.tolist() == [i for i in range(40) if i not in (7, 9, 21)]
    assert torch.equal(Xd, X[:, kept]) and torch.equal(Yd, Y[:, kept])


def test_distinct_columns_compare_every_row_not_only_the_hashed_ones():
    """Columns are bucketed by a sample of their rows; two columns equal there but not everywhere are
    both kept, whichever row tells them apart."""
    from rksp_cli.screen import _distinct_columns

    g = torch.Generator().manual_seed(1)
    d = 96
    for row in range(d):
        X, Y = torch.randn(d, 5, generator=g), torch.randn(d, 5, generator=g)
        X[:, 4], Y[:, 4] = X[:, 2], Y[:, 2]  # a true repeat
        X[:, 1], Y[:, 1] = X[:, 0], Y[:, 0]
        Y[row, 1] += 1.0  # differs from column 0 in this one row only
        assert _distinct_columns(X, Y)[2].tolist() == [0, 1, 2, 3]


def test_the_cost_estimate_counts_the_eta_refits_above_the_calibrations_sample(monkeypatch):
    from rksp_cli import budget
    from rksp_cli.koopman import DMDSettings

    assert budget.ETA_TOKENS == DMDSettings().eta_tokens  # kept apart so that the estimate needs no torch
    shape = budget.ModelShape(parameters=10**7, block_parameters=10**6, n_layers=4, d_model=256, vocab_size=256,
                              seq_len=32, n_heads=4, lm_head=True, streamed=False)  # fmt: skip
    with_refits = budget.screen_cost(shape, 8192, threads=2).seconds
    at_calibration_size = budget.screen_cost(shape, 2048, threads=2).seconds
    monkeypatch.setattr(budget, "ETA_TOKENS", 10**9)  # as if eta_nl were read on the whole sample
    assert with_refits > budget.screen_cost(shape, 8192, threads=2).seconds
    assert budget.screen_cost(shape, 2048, threads=2).seconds == at_calibration_size  # no refit at 2048 states


def test_a_sample_the_operator_fits_exactly_is_not_scored():
    """With N <= d + 1 distinct token states the fit is exact: no risk, no edge, and the advice."""

    def at(tokens):
        return screen(spec_from_dict({"model": {"d_model": 128, "n_layers": 2}, "training": {"lr": 1e-3},
                                      "probe": {"tokens": tokens}}))  # fmt: skip

    exact = at(64)
    assert exact.features["token_states"] == 64
    assert math.isnan(exact.risk.risk) and math.isnan(exact.risk.lr_edge) and exact.risk.verdict != "low"
    assert "fits them exactly" in exact.risk.reason and "probe.tokens >= 512" in exact.risk.reason
    measured = at(512)
    assert math.isfinite(measured.risk.risk) and math.isfinite(measured.risk.lr_edge)


@pytest.fixture
def two_threads():
    """The suite runs on one torch thread (conftest), where transitions are profiled one at a time."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _transitions(count: int, d: int = 24, n: int = 300) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Snapshot pairs of normal operators (kappa(V) = 1), each with other eigenvalues."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for k in range(count):
        Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
        X = torch.randn(d, n, generator=gen, dtype=torch.float64)
        Y = (Q * torch.linspace(0.5, 1.2 + 0.05 * k, d, dtype=torch.float64)) @ Q.T @ X
        out.append((X, Y + 0.01 * torch.randn(d, n, generator=gen, dtype=torch.float64), torch.arange(n)))
    return out


def test_transitions_profiled_at_once_equal_one_at_a_time(two_threads):
    from rksp_cli.koopman import DMDSettings
    from rksp_cli.screen import _profile

    transitions = _transitions(3)  # odd: the last one has no partner
    settings = DMDSettings()
    at_once = _profile(transitions, settings, at_once=2)
    assert torch.get_num_threads() == 2  # restored
    torch.set_num_threads(1)  # each of the two above ran on one thread
    alone = _profile(transitions, settings, at_once=1)
    assert len(at_once) == len(alone) == 3
    for a, b in zip(at_once, alone, strict=True):
        # the same operator to float64 round-off; its eigenvalues come from a float32 solve of a normal
        # operator (perturbation <= ||dA||, dA ~ eps32 ||A||), so 1e-5 leaves a wide margin
        for part in (torch.abs, torch.real, torch.imag):
            torch.testing.assert_close(part(a.eigenvalues).sort()[0], part(b.eigenvalues).sort()[0], rtol=0, atol=1e-5)
        assert a.near_unit_mass == b.near_unit_mass and a.expansive_mass == b.expansive_mass
        assert a.eta_nl == pytest.approx(b.eta_nl, rel=1e-9)
    radii = [s.spectral_radius for s in at_once]
    assert radii == sorted(radii)  # in the order given: each transition's operator is wider than the last


def test_a_failing_transition_restores_the_thread_count(two_threads):
    from rksp_cli.koopman import DMDSettings
    from rksp_cli.screen import _profile

    X, Y, seq = _transitions(1)[0]
    with pytest.raises(ValueError, match="shape"):
        _profile([(X, Y, seq), (X, Y[:, :-1], seq)], DMDSettings(), at_once=2)
    assert torch.get_num_threads() == 2


def test_a_screen_on_two_threads_reports_every_transition_in_order(two_threads):
    progress: list[int] = []
    result = _screen(
        {"norm": "pre", "d_model": 32, "n_heads": 4, "n_layers": 3}, on_layer=lambda i, n: progress.append(i)
    )
    assert progress == [1, 2, 3]
    assert len(result.spectra) == len(result.timings["layers"]) == 3
    assert all(row["dmd"] > 0 for row in result.timings["layers"])
    assert result.timings["dmd"] == pytest.approx(sum(row["dmd"] for row in result.timings["layers"]))
