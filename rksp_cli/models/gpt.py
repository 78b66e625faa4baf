"""The built-in GPT-2-style decoder, small enough to hold in your head.

It exists so that runs labelled by ``rksp probe`` and the screens that score them use exactly the
same model. Six residual-stream normalisations:

* ``pre``: x + attn(LN(x)), x + mlp(LN(x))
* ``post``: LN(x + attn(x)), LN(x + mlp(x))
* ``rms``: ``pre`` with RMSNorm
* ``none``: x + attn(x), x + mlp(x), and no final norm
* ``deepnorm`` (Wang et al. 2022, "DeepNet"): LN(alpha x + f(x)) with alpha = (2L)^(1/4) and the
  value, output-projection and MLP weights initialised with std scaled by beta = (8L)^(-1/4)
  (the decoder-only constants of that paper, L = number of blocks).
* ``subln`` (Wang et al. 2022, "Foundation Transformers"/Magneto): ``pre`` plus a LayerNorm
  before each sublayer's output projection (attention output, and MLP hidden activations), with
  the value, output-projection and MLP weights' std scaled by gamma = sqrt(ln(2L)).

``n_experts`` > 0 replaces every MLP with a top-2 mixture of experts (for the MoE router monitor).
``qk_norm`` adds a LayerNorm on each head's queries and keys (Dehghani et al. 2023; Wortsman et
al. 2023), the usual fix for attention-logit growth at high learning rates. ``sigma_reparam``
reparametrises every linear weight as gamma W / sigma(W) (Zhai et al. 2023, the fix for
attention entropy collapse), after the init below.

Init: every weight matrix and embedding N(0, init_std^2) (times the per-norm factors above),
biases zero, norm gains one. With ``zero_init_residual`` the output projection of every residual
branch starts at zero (the Fixup/ReZero family), so every block is the identity at init.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

NORMS = ("pre", "post", "rms", "none", "deepnorm", "subln")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 103
    seq_len: int = 32
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    norm: str = "pre"
    init_std: float = 0.02
    zero_init_residual: bool = False
    n_experts: int = 0  # > 0: every MLP becomes a top-2 mixture of this many experts
    qk_norm: bool = False  # LayerNorm on each head's queries and keys
    sigma_reparam: bool = False  # every linear weight W -> gamma W / sigma(W) (SigmaReparam)

    @property
    def post_norm(self) -> bool:
        return self.norm in ("post", "deepnorm")


def _norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "none":
        return nn.Identity()
    if cfg.norm == "rms":
        return nn.RMSNorm(cfg.d_model, eps=1e-5)
    return nn.LayerNorm(cfg.d_model, eps=1e-5)


class SigmaReparam(nn.Module):
    """sigmaReparam (Zhai et al. 2023, arXiv 2303.06296), as apple/ml-sigma-reparam has it: W ->
    gamma W / sigma(W), sigma(W) from one power-iteration step per training forward (the vector kept
    between steps, gradients through sigma), gamma learnable and initialised to sigma(W) by SVD, so
    the layer starts exactly as initialised. A ``torch.nn.utils.parametrize`` parametrisation."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        with torch.no_grad():
            _, s, vh = torch.linalg.svd(weight.float(), full_matrices=False)
        self.register_buffer("u", vh[0].to(weight.dtype))
        self.gamma = nn.Parameter(s[:1].to(weight.dtype))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            v = F.normalize(weight @ self.u, dim=0)
            u = F.normalize(weight.T @ v, dim=0)
            if self.training:
                self.u.copy_(u)
        return self.gamma * weight / torch.einsum("c,cd,d->", v, weight, u)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.sub_norm = nn.LayerNorm(cfg.d_model, eps=1e-5) if cfg.norm == "subln" else nn.Identity()
        head = cfg.d_model // cfg.n_heads
        self.q_norm = nn.LayerNorm(head, eps=1e-5) if cfg.qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head, eps=1e-5) if cfg.qk_norm else nn.Identity()

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values, (batch, heads, tokens, head width), queries and keys normalised."""
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        return self.q_norm(q), self.k_norm(k), v

    def output(self, y: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (batch, heads, tokens, head width) merged and projected back to the stream."""
        B, H, T, D = y.shape
        return self.proj(self.sub_norm(y.transpose(1, 2).contiguous().view(B, T, H * D)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(F.scaled_dot_product_attention(*self.heads(x), is_causal=True))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.fc = nn.Linear(cfg.d_model, hidden)
        self.act = nn.GELU()  # a module, so that hooks see it (spectral alignment asks what feeds ``proj``)
        self.proj = nn.Linear(hidden, cfg.d_model)
        self.sub_norm = nn.LayerNorm(hidden, eps=1e-5) if cfg.norm == "subln" else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.sub_norm(self.act(self.fc(x))))


class MoE(nn.Module):
    """Top-2 mixture of MLP experts (Mixtral's routing). Every expert runs on every token and the
    unchosen outputs are weighted by zero: wasteful, but short enough to read, for small models."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.top_k = min(2, cfg.n_experts)
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.router(x).softmax(-1)
        top, chosen = probs.topk(self.top_k, dim=-1)
        gates = torch.zeros_like(probs).scatter(-1, chosen, top / top.sum(-1, keepdim=True))
        return sum(gates[..., e : e + 1] * expert(x) for e, expert in enumerate(self.experts))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.post_norm = cfg.post_norm
        self.alpha = (2 * cfg.n_layers) ** 0.25 if cfg.norm == "deepnorm" else 1.0
        self.norm1, self.norm2 = _norm(cfg), _norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MoE(cfg) if cfg.n_experts else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norm:
            x = self.norm1(self.alpha * x + self.attn(x))
            return self.norm2(self.alpha * x + self.mlp(x))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _mlp_linears(block: Block, name: str) -> list[nn.Linear]:
    mlps = block.mlp.experts if isinstance(block.mlp, MoE) else [block.mlp]
    return [getattr(mlp, name) for mlp in mlps]


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {cfg.norm!r}")
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model ({cfg.d_model}) must be divisible by n_heads ({cfg.n_heads})")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = _norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.sigma_reparam:
            for module in list(self.modules()):
                if isinstance(module, nn.Linear):
                    parametrize.register_parametrization(module, "weight", SigmaReparam(module.weight))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        cfg = self.cfg
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, cfg.init_std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        scale = {"deepnorm": (8 * cfg.n_layers) ** -0.25, "subln": math.sqrt(math.log(2 * cfg.n_layers))}.get(cfg.norm)
        for block in self.blocks:
            if scale is not None:
                block.attn.qkv.weight[2 * cfg.d_model :].mul_(scale)  # the value projection
                for lin in (block.attn.proj, *_mlp_linears(block, "fc"), *_mlp_linears(block, "proj")):
                    lin.weight.mul_(scale)
            if cfg.zero_init_residual:
                for lin in (block.attn.proj, *_mlp_linears(block, "proj")):
                    lin.weight.zero_()

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """h_0: token plus position embeddings."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok_emb(idx) + self.pos_emb(pos)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if idx.shape[1] > self.cfg.seq_len:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds seq_len {self.cfg.seq_len}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final_norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return logits, loss
