r"""The normalized Transformer, nGPT (Loshchilov et al., 2025): every vector on the unit sphere.

nGPT keeps no norm layer. Instead the hidden state, the embeddings and every row of the weight
matrices along the model dimension are unit vectors. Each block moves the state a learned step
towards what its sublayer proposes, and back onto the sphere:

.. math::

    h_A = \mathrm{unit}(\mathrm{Attn}(h)), \qquad
    h \leftarrow \mathrm{unit}\big(h + \alpha_A \odot (h_A - h)\big),

and the same with the MLP (:math:`\alpha_M`), where :math:`\mathrm{unit}(x) = x / \lVert x
\rVert_2` and :math:`\alpha_A, \alpha_M \in \mathbb{R}^D` are the "eigen learning rates" of the
paper. Queries and keys are unit vectors per head times a learned scale :math:`s_{qk}`, so the
softmax takes :math:`\sqrt{d_h}\, q \cdot k` (a cosine times :math:`\sqrt{d_h}\, s_{qk}^2`); the
MLP is SwiGLU with learned scales :math:`s_u, s_\nu`; the logits are :math:`s_z \odot E_{out}
h`. The weights are put back on the sphere after every update (:meth:`NGPT.project_`).

Two choices of this small version, stated where a reader compares it with the paper: positions
are a learned embedding added to the token's before the first :math:`\mathrm{unit}` (the paper
uses rotary embeddings), and each learned scale is stored as the paper does, a parameter
started at ``scale`` and multiplied by ``init / scale`` in the forward, so that Adam moves it at
the pace the paper chose.

Shape: token ids ``(B, T)`` in, logits ``(B, T, V)`` out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import ShapeError
from lnbook.transformer import check_shape, softmax

__all__ = ["NGPTConfig", "NGPT", "Scale", "unit"]


def unit(x: Tensor, dim: int = -1) -> Tensor:
    """``x / ||x||_2`` along ``dim`` (the sphere nGPT keeps every vector on)."""
    return F.normalize(x, dim=dim)


@dataclass
class NGPTConfig:
    """Everything that defines an :class:`NGPT`.

    Attributes:
        vocab_size, d_model, n_heads, n_layers, max_len: as :class:`lnbook.TransformerConfig`.
        d_ff: SwiGLU width; None for ``8 * d_model // 3`` (then the MLP has the ``8 D^2``
            weights of a GELU MLP of width ``4 D``).
        alpha_init: the eigen learning rates' start (the paper: 0.05 at its depths).
    """

    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    max_len: int
    d_ff: int | None = None
    alpha_init: float = 0.05

    def __post_init__(self) -> None:
        check_shape(self)
        if self.d_ff is None:
            self.d_ff = 8 * self.d_model // 3
        if not 0.0 < float(self.alpha_init) <= 1.0:
            raise ValueError(f"alpha_init must lie in (0, 1], got {self.alpha_init!r}")
        self.alpha_init = float(self.alpha_init)


class Scale(nn.Module):
    """A learned per-feature scale, stored as nGPT stores it: ``param * (init / scale)`` with
    ``param`` started at ``scale``, so it starts at ``init``."""

    def __init__(self, size: int, init: float, scale: float) -> None:
        super().__init__()
        self.init, self.scale = float(init), float(scale)
        self.param = nn.Parameter(torch.full((size,), self.scale))

    def forward(self) -> Tensor:
        return self.param * (self.init / self.scale)  # (size,)

    def extra_repr(self) -> str:
        return f"size={self.param.numel()}, init={self.init:g}, scale={self.scale:g}"


class _Block(nn.Module):
    """One nGPT block: attention, then the SwiGLU MLP, each a step on the sphere."""

    def __init__(self, c: NGPTConfig) -> None:
        super().__init__()
        d, self.n_heads, self.d_head = c.d_model, c.n_heads, c.d_model // c.n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.u, self.nu = nn.Linear(d, c.d_ff, bias=False), nn.Linear(d, c.d_ff, bias=False)
        self.down = nn.Linear(c.d_ff, d, bias=False)
        base = 1 / math.sqrt(d)
        self.alpha_a, self.alpha_m = Scale(d, c.alpha_init, base), Scale(d, c.alpha_init, base)
        self.s_qk = Scale(d, 1.0, base)
        self.s_u, self.s_nu = Scale(c.d_ff, 1.0, 1.0), Scale(c.d_ff, 1.0, 1.0)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def attention(self, h: Tensor) -> Tensor:
        s = self._heads(self.s_qk()[None, None])  # (1, H, 1, Dh)
        q = unit(self._heads(self.q(h))) * s  # (B, H, T, Dh)
        k = unit(self._heads(self.k(h))) * s  # (B, H, T, Dh)
        att = q @ k.transpose(-2, -1) * math.sqrt(self.d_head)  # (B, H, T, T)
        t = h.shape[1]
        seen = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()  # (T, T) causal
        att = softmax(att.masked_fill(~seen, float("-inf")))  # (B, H, T, T)
        y = att @ self._heads(self.v(h))  # (B, H, T, Dh)
        return self.o(y.transpose(1, 2).flatten(2))  # (B, T, D)

    def mlp(self, h: Tensor) -> Tensor:
        u = self.u(h) * self.s_u()  # (B, T, F)
        nu = self.nu(h) * (self.s_nu() * math.sqrt(h.shape[-1]))  # (B, T, F)
        return self.down(u * F.silu(nu))  # (B, T, D)

    def forward(self, h: Tensor) -> Tensor:
        h = unit(h + self.alpha_a() * (unit(self.attention(h)) - h))  # (B, T, D) on the sphere
        return unit(h + self.alpha_m() * (unit(self.mlp(h)) - h))

    def matrices(self) -> list[tuple[str, int]]:
        """Each weight's name with the dimension along which its vectors live in the model
        space: rows of the maps out of it (``-1``), columns of the maps into it (``-2``)."""
        return ([(f"{m}.weight", -1) for m in ("q", "k", "v", "u", "nu")]
                + [("o.weight", -2), ("down.weight", -2)])


class NGPT(nn.Module):
    """The normalized Transformer (see the module's docstring) from an :class:`NGPTConfig`.

    ``NGPT(vocab_size, d_model, n_heads, n_layers, max_len, **fields)`` is shorthand for
    ``NGPT(NGPTConfig(...))``. Call :meth:`project_` after every optimizer update.
    """

    def __init__(self, config: NGPTConfig | int, *sizes: int, **fields: object) -> None:
        super().__init__()
        c = config if isinstance(config, NGPTConfig) else NGPTConfig(config, *sizes, **fields)
        self.config = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.max_len, c.d_model)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.n_layers))
        self.out_emb = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.s_z = Scale(c.vocab_size, 1.0, 1 / math.sqrt(c.d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every matrix drawn N(0, 1/D) and put on the sphere; the scales at their start."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=self.config.d_model ** -0.5)
            elif name.endswith("param"):
                with torch.no_grad():
                    p.fill_(self.get_submodule(name.rsplit(".", 1)[0]).scale)
        self.project_()

    def matrices(self) -> list[tuple[str, int]]:
        """Every weight kept on the sphere, by name, with the dimension its unit vectors run
        along (negative, so that it holds for a stack of copies too)."""
        out = [("tok_emb.weight", -1), ("pos_emb.weight", -1), ("out_emb.weight", -1)]
        for i, block in enumerate(self.blocks):
            out += [(f"blocks.{i}.{name}", dim) for name, dim in block.matrices()]
        return out

    @torch.no_grad()
    def project_(self) -> NGPT:
        """Put every weight back on the sphere (after an optimizer update); returns ``self``."""
        for name, dim in self.matrices():
            w = self.get_parameter(name)
            w.copy_(unit(w, dim))
        return self

    def forward(self, idx: Tensor) -> Tensor:
        if not isinstance(idx, Tensor) or idx.dtype not in (torch.int64, torch.int32):
            raise TypeError("token ids must be an int64 (or int32) tensor of shape (B, T)")
        if idx.dim() != 2 or idx.shape[1] > self.config.max_len:
            raise ShapeError(f"token ids must have shape (B, T) with T <= "
                             f"{self.config.max_len}, got {tuple(idx.shape)}")
        pos = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        h = unit(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, D)
        for block in self.blocks:
            h = block(h)  # (B, T, D), every row a unit vector
        return self.out_emb(h) * self.s_z()  # (B, T, V)

    def extra_repr(self) -> str:
        c = self.config
        return f"d_model={c.d_model}, n_layers={c.n_layers}, alpha_init={c.alpha_init:g}"
