"""The screen config: its schema, and loaders for every kind of path ``rksp screen`` accepts.

A screen config is a contract other tools write (sweeps, CI jobs), so the schema is strict:
unknown fields are errors, and every error is one sentence naming the field or the file.

Accepted paths:

* ``*.yaml`` / ``*.yml``: a screen config (relative paths inside resolve against its folder);
* ``*.json``: a transformers ``config.json``, randomly initialised from the config;
* a directory holding ``config.json``: a Hugging Face checkpoint;
* ``*.safetensors``: bare weights, with the architecture from the ``config.json`` beside them;
* ``*.bin`` / ``*.pt`` / ``*.pth``: a pickle checkpoint (refused unless pickle is allowed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from rksp_cli import MAX_SEED
from rksp_cli.errors import InputError
from rksp_cli.models.gpt import NORMS, GPTConfig
from rksp_cli.tasks import TASKS

CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
SPEC_SUFFIXES = (".yaml", ".yml")

# Fields of ``model`` that describe the built-in GPT; a transformers config or checkpoint
# carries its own architecture, so setting one of these beside it is a contradiction.
_GPT_ONLY = ("norm", "d_model", "n_layers", "n_heads", "vocab_size", "mlp_ratio", "zero_init_residual", "n_experts",
             "qk_norm", "sigma_reparam")  # fmt: skip

# Fields added after sweep journals existed, with the value a config had before them: at that
# value (or unset) they stay out of the key, so an older journal's rows still resume.
ADDED_LATER = {
    ("model", "qk_norm"): False,
    ("model", "sigma_reparam"): False,
    ("training", "z_loss"): 0.0,
    ("training", "kss_variant"): "paper",
    ("training", "track_every"): 0,
    ("training", "guard"): None,
    ("training", "guard_every"): 50,
}


def _rank(value: Any) -> Any:
    if value in ("auto", "full"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"must be 'auto', 'full' or a positive integer (a principal-subspace rank), got {value!r}")


class _Section(BaseModel):
    # inf and nan are never a setting: a non-finite lr or init scale cannot be scored, so refuse it
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelSpec(_Section):
    """What to screen: the built-in GPT (``arch: gpt``), a transformers config, or a checkpoint."""

    arch: Literal["gpt"] | None = None
    hf_config: Path | None = None
    checkpoint: Path | None = None
    norm: Literal[NORMS] | None = None  # type: ignore[valid-type]
    d_model: Annotated[int, Field(ge=1)] | None = None
    n_layers: Annotated[int, Field(ge=1)] | None = None
    n_heads: Annotated[int, Field(ge=1)] | None = None
    vocab_size: Annotated[int, Field(ge=2)] | None = None
    seq_len: Annotated[int, Field(ge=2)] | None = None
    init_std: Annotated[float, Field(gt=0)] | None = None
    mlp_ratio: Annotated[int, Field(ge=1)] | None = None
    zero_init_residual: bool | None = None
    n_experts: Annotated[int, Field(ge=0)] | None = None
    qk_norm: bool | None = None
    sigma_reparam: bool | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        given = [k for k in ("arch", "hf_config", "checkpoint") if getattr(self, k) is not None]
        if given == ["hf_config", "checkpoint"]:
            given = ["checkpoint"]  # hf_config then names the architecture of bare weights
        if len(given) > 1:
            raise ValueError(f"give one of arch, hf_config or checkpoint, not {' and '.join(given)}")
        if not given:
            self.arch = "gpt"
        if self.arch == "gpt":
            defaults = GPTConfig()
            for f in fields(GPTConfig):
                if getattr(self, f.name) is None:
                    setattr(self, f.name, getattr(defaults, f.name))
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
            return self
        clash = [k for k in _GPT_ONLY if getattr(self, k) is not None]
        if self.checkpoint is not None and self.init_std is not None:
            clash.append("init_std")
        if clash:
            source = "checkpoint" if self.checkpoint is not None else "hf_config"
            raise ValueError(f"{', '.join(clash)} cannot be set with {source}: the architecture comes from its config")
        return self

    def gpt_config(self) -> GPTConfig:
        assert self.arch == "gpt"
        return GPTConfig(**{f.name: getattr(self, f.name) for f in fields(GPTConfig)})


class TrainingSpec(_Section):
    """The run the screen is for. The spectra never see these; the risk model does."""

    lr: Annotated[float, Field(gt=0)] | None = None
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    batch_size: Annotated[int, Field(ge=1)] = 16
    weight_decay: Annotated[float, Field(ge=0)] = 0.1
    grad_clip: Annotated[float, Field(gt=0)] | None = None
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.95)
    # What `rksp probe` trains on, for how long, and what counts as divergence (RKSP paper, 3.1).
    steps: Annotated[int, Field(ge=1)] = 300
    task: str = "synthetic_lm"  # synthetic_lm | assoc_recall | a text or .npy file (character-level LM)
    diverge_loss: Annotated[float, Field(gt=0)] = 50.0
    diverge_grad_norm: Annotated[float, Field(gt=0)] = 500.0
    kss_alpha: Annotated[float, Field(ge=0)] = 0.0  # rksp probe: Koopman Spectral Shaping weight; 0 = off
    kss_every: Annotated[int, Field(ge=1)] = 10  # rksp probe: KSS interval in steps
    kss_variant: Literal["paper", "growth"] = "paper"  # rksp probe: the published KSS, or its operator-norm form
    z_loss: Annotated[float, Field(ge=0)] = 0.0  # rksp probe: PaLM's z-loss weight on log(Z)^2 (1e-4 there); 0 = off
    track_every: Annotated[int, Field(ge=0)] = 0  # rksp probe: screen the spectra every N steps of training; 0 = off
    # rksp probe: act on every rksp monitor's alarms (skip the step, back off the lr or roll back;
    # rksp_cli/monitors/guard.py), the monitors checking every ``guard_every`` steps; None = off
    guard: Literal["skip", "backoff", "rollback"] | None = None
    guard_every: Annotated[int, Field(ge=1)] = 50

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        if value not in TASKS and not Path(value).is_file():
            raise ValueError(f"must be one of {', '.join(TASKS)} or a text file; {value} does not exist")
        return value


class ProbeSpec(_Section):
    """How the residual stream is sampled and how the spectra are estimated."""

    tokens: Annotated[int, Field(ge=8)] = 2048
    rank: Annotated[Literal["auto", "full"] | int, BeforeValidator(_rank)] = "auto"
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    input: str = "random"
    residual_tol: Annotated[float, Field(gt=0)] | None = None  # ResDMD filter tau; off by default (koopman.py)
    kappa: bool = False  # compute kappa(V): eigenvectors and their SVD, ~2.5x the DMD's cost (koopman.py)

    @field_validator("input")
    @classmethod
    def _input_exists(cls, value: str) -> str:
        if value != "random" and not Path(value).is_file():
            raise ValueError(f"must be 'random' or a text/token file; {value} does not exist")
        return value


class ScreenSpec(_Section):
    model: ModelSpec = Field(default_factory=ModelSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    probe: ProbeSpec = Field(default_factory=ProbeSpec)

    def resolved(self) -> dict[str, Any]:
        """The config as JSON-ready data, every default filled in."""
        return self.model_dump(mode="json")

    def key(self, with_seed: bool = True) -> str:
        """A stable hash of the resolved config: with the seed it names a run, without it a configuration."""
        data = self.resolved()
        for (section, name), before in ADDED_LATER.items():
            if data[section].get(name) in (before, None):
                data[section].pop(name, None)
        if not with_seed:
            data["probe"].pop("seed")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def load_spec(path: str | Path, overrides: list[str] | None = None) -> ScreenSpec:
    """Read any accepted path into a validated ``ScreenSpec``, then apply ``--set`` overrides."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    raw = _raw_from_path(path)
    for item in overrides or []:
        apply_override(raw, item)
    return spec_from_dict(raw, source=str(path))


def spec_from_dict(raw: dict[str, Any], source: str = "config") -> ScreenSpec:
    """Validate plain data (from YAML, a sweep grid, a test) into a ``ScreenSpec``."""
    try:
        spec = ScreenSpec.model_validate(raw)
    except ValidationError as exc:
        raise InputError(f"{source}: {_describe(exc)}") from None
    for field in ("hf_config", "checkpoint"):
        value = getattr(spec.model, field)
        if value is not None and not value.exists():
            raise InputError(f"{source}: model.{field}: {value} does not exist")
    return spec


def _raw_from_path(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{path}: a directory must be a Hugging Face checkpoint with a config.json")
        return {"model": {"checkpoint": str(path)}}
    if suffix == ".json":
        return {"model": {"hf_config": str(path)}}
    if suffix in CHECKPOINT_SUFFIXES:
        return {"model": {"checkpoint": str(path)}}
    if suffix not in SPEC_SUFFIXES:
        raise InputError(
            f"{path}: unsupported file type {suffix or '(none)'}; expected a .yaml screen config, a "
            "transformers config.json, a checkpoint directory or a .safetensors file"
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InputError(f"{path}: not valid YAML{where}") from None
    if raw is None:
        raise InputError(f"{path}: the file is empty; write at least one section (model, training or probe)")
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a mapping with model/training/probe sections")
    _resolve_relative_paths(raw, path.parent)
    return raw


def _resolve_relative_paths(raw: dict[str, Any], base: Path) -> None:
    """Paths written in a config file are relative to that file, as users expect."""
    keywords = {"random", *TASKS}
    for section, key in (("model", "hf_config"), ("model", "checkpoint"), ("probe", "input"), ("training", "task")):
        block = raw.get(section)
        if not isinstance(block, dict) or not isinstance(block.get(key), str):
            continue
        value = block[key]
        if value in keywords:
            continue
        if not Path(value).is_absolute():
            block[key] = str(base / value)


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one ``--set SECTION.FIELD=VALUE`` (the value read as YAML) to raw config data."""
    key, sep, text = item.partition("=")
    if not sep or not all(key.strip().split(".")):
        raise InputError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. training.lr=3e-3")
    if not text.strip():
        raise InputError(f"--set {item!r}: no value after '='; write null to unset a field")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    set_field(raw, key.strip(), value, where=f"--set {item!r}")


def set_field(raw: dict[str, Any], dotted: str, value: Any, where: str = "") -> None:
    """Set ``section.field`` in raw config data, creating sections as needed."""
    parts = dotted.split(".")
    target = raw
    for part in parts[:-1]:
        node = target.setdefault(part, {})
        if not isinstance(node, dict):
            raise InputError(f"{where or dotted}: {part} is not a section")
        target = node
    target[parts[-1]] = value


def flatten(data: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Nested config data as flat ``prefix.section.field`` columns (lists joined by commas)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name))
        elif isinstance(value, (list, tuple)):
            out[name] = ",".join(str(v) for v in value)
        else:
            out[name] = value
    return out


def _describe(exc: ValidationError) -> str:
    """One line for the first validation error: 'field.path: what is wrong'."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    else:
        msg = first["msg"].removeprefix("Value error, ")
        if "input" in first and first["type"] not in ("value_error",) and not isinstance(first["input"], dict):
            msg += f" (got {first['input']!r})"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"
