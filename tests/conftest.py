"""Shared fixtures: small transformers configs and checkpoints made on the spot (no hub access)."""

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

torch.set_num_threads(1)  # deterministic and quiet on a 2-core CI machine

# The shape every small transformers config shares: 2 layers of width 32, 4 heads, 96 tokens.
_SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=96)

HF_CONFIGS = {
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=96, n_positions=64)),
    "llama": ("LlamaConfig", _SMALL | dict(num_key_value_heads=2, max_position_embeddings=64)),
    "mixtral": (
        "MixtralConfig",
        _SMALL | dict(num_key_value_heads=2, num_local_experts=4, max_position_embeddings=64),
    ),
    "bert": ("BertConfig", _SMALL),
    "gpt_neox": ("GPTNeoXConfig", _SMALL | dict(max_position_embeddings=64)),
    "mamba": ("MambaConfig", dict(hidden_size=32, num_hidden_layers=2, vocab_size=96, state_size=8)),
}


def hf_config(name: str):
    import transformers

    cls, kwargs = HF_CONFIGS[name]
    return getattr(transformers, cls)(**kwargs)


@pytest.fixture
def hf_config_file(tmp_path: Path):
    def make(name: str) -> Path:
        path = tmp_path / f"{name}.json"
        hf_config(name).to_json_file(path)
        return path

    return make


@pytest.fixture
def write_yaml(tmp_path: Path):
    def make(text: str, name: str = "screen.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return make


@pytest.fixture
def benchmark_script(monkeypatch) -> Callable[[str], ModuleType]:
    """Imports a script of benchmarks/ by name, with that folder on the path (the scripts import
    their siblings, e.g. ``machine``, as they do when run)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    return importlib.import_module


@pytest.fixture
def margin_step(benchmark_script) -> float:
    """Twice the control-margin bisection's tolerance: a margin is exact to within it."""
    return 2 * benchmark_script("control_margin").TOLERANCE
