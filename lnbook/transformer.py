"""A small, readable Transformer for Part II, built nanoGPT's way from one
:class:`TransformerConfig` (norm kind, placement, qk-norm, DeepNorm, LayerNorm Scaling), with the
measurements the chapters make (attention logits, gradient norms per layer, norm inputs and
outputs, the Pre-LN to Pre-RMSNorm conversion). Chapters "RMSNorm", "Where the norm goes",
"QK-norm" and "Transformers without normalization".
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import ShapeError, check_choice, check_size, make_module
from lnbook.norms import LN_IMPL, LN_IMPLS, LayerNorm
from lnbook.variants import DyT, RMSNorm

__all__ = ["TransformerConfig", "softmax", "SelfAttention", "MLP", "Block", "Transformer",
           "make_norm", "deepnorm_constants", "sequence_loss", "max_attention_logits",
           "layer_gradient_norms", "norm_inputs_outputs", "residual_stream",
           "center_residual_stream_", "to_pre_rmsnorm", "IGNORE_INDEX"]

NormKind = Literal["layer", "rms", "dyt", "none"]
NormFactory = Callable[[int], nn.Module]
Device = torch.device | str | None
Dtype = torch.dtype | None
Position = Literal["pre", "post", "peri", "output", "rezero"]
NORMS = ("layer", "rms", "dyt", "none")
POSITIONS = ("pre", "post", "peri", "output", "rezero")
IGNORE_INDEX = -100  # targets with this value are not scored (torch's cross_entropy default)


@dataclass
class TransformerConfig:
    """Everything that defines a :class:`Transformer` (nanoGPT's ``GPTConfig``); checked when made.

    Attributes:
        vocab_size, d_model, n_heads, n_layers, max_len: ``V``, ``D``, heads (dividing ``D``),
            blocks ``L``, the longest sequence.
        d_ff: feed-forward width; None for ``4 * d_model``.
        norm: ``"layer"``, ``"rms"``, ``"dyt"``, ``"none"`` or a factory ``size -> module``.
        position: ``"pre"``, ``"post"``, ``"peri"``, ``"output"`` or ``"rezero"`` (see
            :class:`Block`).
        qk_norm: layer-normalize queries and keys per head.
        final_norm: a norm after the last block; None for the placement's usual choice.
        depth_scaling: multiply the norms of block ``l`` by ``1 / sqrt(l)`` (Sun et al., 2025).
        dropout: on attention weights, branch outputs and embeddings, in [0, 1).
        causal, bias: causal attention; biases in the linear layers.
        deepnorm: DeepNorm's residual weight and init (needs ``position="post"``).
        eps, dyt_alpha_init: of the layer/RMS norms and of DyT.
        ln_impl: ``impl`` of every :class:`lnbook.LayerNorm` (``"torch"`` or ``"autograd"``).
        attn_sink, attn_clip, attn_gate: the attention options of :class:`SelfAttention`
            (``sink``, ``clip``, ``gate``): a learned key and value every query can attend to,
            the clipped softmax's ``(gamma, zeta)``, a sigmoid gate per head.
    """

    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    max_len: int
    d_ff: int | None = None
    norm: NormKind | NormFactory = "layer"
    position: Position = "pre"
    qk_norm: bool = False
    final_norm: bool | None = None  # None: True for "pre", False for "post"
    dropout: float = 0.0
    causal: bool = True
    deepnorm: bool = False
    eps: float = 1e-5
    dyt_alpha_init: float = 0.5
    bias: bool = True
    ln_impl: Literal["autograd", "torch"] = LN_IMPL
    depth_scaling: bool = False
    attn_sink: bool = False
    attn_clip: tuple[float, float] | None = None
    attn_gate: bool = False

    def __post_init__(self) -> None:
        check_shape(self)
        if not callable(self.norm):
            check_choice("norm", self.norm, NORMS)
        check_choice("position", self.position, POSITIONS)
        check_choice("ln_impl", self.ln_impl, LN_IMPLS)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.deepnorm and self.position != "post":
            raise ValueError(
                f"deepnorm=True needs position='post', got position={self.position!r}")
        if self.attn_clip is not None:
            self.attn_clip = _check_clip(self.attn_clip)
        for name in ("qk_norm", "causal", "deepnorm", "bias", "depth_scaling", "attn_sink",
                     "attn_gate"):
            setattr(self, name, bool(getattr(self, name)))
        for name in ("dropout", "eps", "dyt_alpha_init"):
            setattr(self, name, float(getattr(self, name)))

    def has_final_norm(self) -> bool:
        """``final_norm``; when None: no for Post-LN (its last block ends in a norm), else yes."""
        return self.position != "post" if self.final_norm is None else bool(self.final_norm)


def check_shape(config: Any) -> None:
    """Check (in place) the sizes a Transformer's config and nGPT's share: ``vocab_size``,
    ``d_model``, ``n_heads`` (dividing ``d_model``), ``n_layers``, ``max_len`` and ``d_ff``
    (None is left for the config to fill)."""
    for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_len"):
        setattr(config, name, check_size(name, getattr(config, name)))
    if config.d_ff is not None:
        config.d_ff = check_size("d_ff", config.d_ff)
    if config.d_model % config.n_heads != 0:
        raise ValueError(f"n_heads ({config.n_heads}) must divide d_model ({config.d_model})")


def make_norm(config: TransformerConfig, size: int | None = None, *, kind: NormKind | None = None,
              device: Device = None, dtype: Dtype = None) -> nn.Module:
    """The one place a Transformer's norms are made: ``config.norm`` (or ``kind``) over ``size``
    features (None: ``d_model``): LayerNorm, RMSNorm, DyT, Identity, or the factory's module."""
    if not isinstance(config, TransformerConfig):
        raise TypeError("make_norm takes the model's config: make_norm(TransformerConfig(..., "
                        f"norm='layer'), size), got {type(config).__name__}")
    size = config.d_model if size is None else size
    kind = config.norm if kind is None else kind
    kw = {"device": device, "dtype": dtype}
    if callable(kind):
        return make_module(kind, size, "config.norm", **kw)
    check_choice("norm", kind, NORMS)
    if kind == "layer":
        return LayerNorm(size, eps=config.eps, impl=config.ln_impl, **kw)
    if kind == "rms":
        return RMSNorm(size, eps=config.eps, **kw)
    if kind == "dyt":
        return DyT(size, alpha_init=config.dyt_alpha_init, **kw)
    return nn.Identity()


def deepnorm_constants(n_layers: int) -> tuple[float, float]:
    """DeepNorm's ``(alpha, beta) = ((2N)^(1/4), (8N)^(-1/4))`` for N decoder blocks (Wang et
    al., 2022): x_{l+1} = LN(alpha x_l + G(x_l)); beta is the init gain of v, out and the FFN."""
    n = check_size("n_layers", n_layers)
    return (2 * n) ** 0.25, (8 * n) ** -0.25


def _check_clip(clip: object) -> tuple[float, float]:
    """``clip`` as ``(gamma, zeta)`` floats with ``gamma <= 0 <= 1 <= zeta``, else ValueError."""
    ok = (isinstance(clip, tuple | list) and len(clip) == 2
          and all(isinstance(c, numbers.Real) and math.isfinite(c) for c in clip))
    if not ok or not (clip[0] <= 0 and clip[1] >= 1):  # type: ignore[index]
        raise ValueError(f"the clipped softmax takes (gamma, zeta) with gamma <= 0 and zeta >= 1, "
                         f"e.g. (-0.03, 1.0), got {clip!r}")
    return float(clip[0]), float(clip[1])  # type: ignore[index]


def softmax(x: Tensor) -> Tensor:
    r"""The softmax over the last dimension, :math:`e^{x_i - m} / \sum_j e^{x_j - m}` with
    :math:`m` the row's largest entry (``-inf`` entries get weight 0).

    The same function as ``x.softmax(-1)`` up to float rounding. On the CPU, in float32 and
    float64, rows shorter than 16 entries (every attention row of the book's quick runs) are
    written out: torch 2.13's CPU kernel takes about 7 times as long on such rows (0.92 ms
    against 0.13 ms for 4,160 rows of 13 entries, one thread). Elsewhere torch's kernel runs.
    """
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64)
            or x.shape[-1] >= 16):
        return x.softmax(dim=-1)
    e = (x - x.amax(dim=-1, keepdim=True).detach()).exp()  # (*, T) the largest is e^0 = 1
    return e / e.sum(dim=-1, keepdim=True)


class SelfAttention(nn.Module):
    r"""Multi-head self-attention with an explicit softmax (Vaswani et al., 2017, eq. 1).

    .. math:: \mathrm{softmax}\Big(\frac{Q K^\top}{\sqrt{d_h}}\Big) V

    per head. With ``qk_norm`` (True for :class:`lnbook.LayerNorm`, or a factory ``d_h ->
    module``) queries and keys are normalized per head first (Dehghani et al., 2023). Every
    forward stores its largest logit, detached, in ``last_max_logit`` (masked ones excluded).

    Three options let a head attend without updating the stream. ``sink``: one learned key
    and value per head (``sink_k``, ``sink_v``, ``(H, d_h)``, started at 0) that every query
    sees besides the tokens, an explicit attention bias (Sun et al., 2024). ``clip=(gamma,
    zeta)``: the clipped softmax ``clamp((zeta - gamma) softmax + gamma, 0, 1)`` (Bondarenko et
    al., 2023), which can give a weight of exactly 0. ``gate``: the heads' outputs times
    ``sigmoid(gate_proj(x))``, one gate per head and token (Bondarenko et al.'s gated
    attention; ``gate_proj`` ``D -> H``).

    Shape: input and output ``(B, T, D)``.
    """

    def __init__(self, d_model: int, n_heads: int, *, qk_norm: bool | NormFactory = False,
                 dropout: float = 0.0, causal: bool = True, bias: bool = True,
                 sink: bool = False, clip: tuple[float, float] | None = None,
                 gate: bool = False, device: Device = None, dtype: Dtype = None) -> None:
        super().__init__()
        d_model, n_heads = check_size("d_model", d_model), check_size("n_heads", n_heads)
        if d_model % n_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must divide d_model ({d_model})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.qk_norm, self.causal = bool(qk_norm), bool(causal)
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(d_model, d_model, bias=bias, **kw)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias, **kw)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias, **kw)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias, **kw)
        if self.qk_norm:
            make = qk_norm if callable(qk_norm) else functools.partial(LayerNorm, impl=LN_IMPL)
            self.q_norm: nn.Module = make_module(make, self.d_head, "qk_norm", **kw)
            self.k_norm: nn.Module = make_module(make, self.d_head, "qk_norm", **kw)
        else:
            self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_dropout = nn.Dropout(dropout)
        self.last_max_logit: Tensor | None = None
        self.sink, self.gate = bool(sink), bool(gate)
        self.clip = None if clip is None else _check_clip(clip)
        if self.sink:
            self.sink_k = nn.Parameter(torch.zeros(n_heads, self.d_head, **kw))
            self.sink_v = nn.Parameter(torch.zeros(n_heads, self.d_head, **kw))
        if self.gate:
            self.gate_proj = nn.Linear(d_model, n_heads, **kw)
        self.reset_options()

    def reset_options(self) -> None:
        """The options' parameters at their start: sink key and value 0; the gate's weights
        Xavier-normal and bias 0 (every gate starts near 1/2)."""
        if self.sink:
            nn.init.zeros_(self.sink_k)
            nn.init.zeros_(self.sink_v)
        if self.gate:
            nn.init.xavier_normal_(self.gate_proj.weight)
            nn.init.zeros_(self.gate_proj.bias)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def logits(self, x: Tensor) -> Tensor:
        """The attention logits ``q . k / sqrt(d_h)`` of input ``x`` ``(B, T, D)``, shape
        ``(B, H, T, T)``; positions a causal head may not see hold ``-inf``."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"attention expects input of shape (B, T, {self.d_model}), got {tuple(x.shape)}"
            )
        t = x.shape[1]
        q = self.q_norm(self._heads(self.q_proj(x)))  # (B, H, T, Dh)
        k = self.k_norm(self._heads(self.k_proj(x)))  # (B, H, T, Dh)
        att = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, T)
        if self.causal:
            seen = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()  # (T, T)
            att = att.masked_fill(~seen, float("-inf"))  # (B, H, T, T)
        return att

    def weights(self, x: Tensor) -> Tensor:
        """The attention weights of input ``x`` ``(B, T, D)``: ``(B, H, T, T)``, or ``(B, H, T,
        T + 1)`` with ``sink`` (the sink's weight last); rows sum to 1 (at most 1 when
        clipped). Stores the largest logit in ``last_max_logit``."""
        att = self.logits(x)  # (B, H, T, T)
        if self.sink:
            q = self.q_norm(self._heads(self.q_proj(x)))  # (B, H, T, Dh)
            s = (q * self.sink_k[:, None]).sum(-1, keepdim=True) / math.sqrt(self.d_head)
            att = torch.cat([att, s], dim=-1)  # (B, H, T, T + 1)
        self.last_max_logit = att.detach().amax()  # () masked entries are -inf
        p = softmax(att)
        if self.clip is not None:
            gamma, zeta = self.clip
            p = ((zeta - gamma) * p + gamma).clamp(0.0, 1.0)
        return p

    def forward(self, x: Tensor) -> Tensor:
        att = self.attn_dropout(self.weights(x))  # (B, H, T, T [+ 1])
        v = self._heads(self.v_proj(x))  # (B, H, T, Dh)
        b, t, d = x.shape
        if self.sink:
            y = att[..., :t] @ v + att[..., t:] * self.sink_v[:, None]  # (B, H, T, Dh)
        else:
            y = att @ v  # (B, H, T, Dh)
        if self.gate:
            y = y * torch.sigmoid(self.gate_proj(x)).transpose(1, 2)[..., None]
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))  # heads side by side

    def extra_repr(self) -> str:
        s = f"n_heads={self.n_heads}, d_head={self.d_head}, causal={self.causal}"
        return s + "".join(f", {k}={v}" for k, v in
                           (("sink", self.sink), ("clip", self.clip), ("gate", self.gate)) if v)


class MLP(nn.Module):
    """The position-wise feed-forward network ``fc2(gelu(fc1(x)))``, ``(*, D) -> (*, D)``
    (Vaswani et al., 2017); ``d_ff`` None for ``4 * d_model``."""

    def __init__(self, d_model: int, d_ff: int | None = None, *, bias: bool = True,
                 device: Device = None, dtype: Dtype = None) -> None:
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else check_size("d_ff", d_ff)
        kw = {"device": device, "dtype": dtype}
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias, **kw)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias, **kw)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # (*, D) via (*, d_ff)


class Block(nn.Module):
    r"""One Transformer block: self-attention and a feed-forward network, each in a residual.

    With ``position="pre"`` (Pre-LN, the norm inside the residual branch):

    .. math:: x \leftarrow x + \mathrm{Attn}(N_1(x)), \qquad x \leftarrow x + \mathrm{MLP}(N_2(x))

    With ``position="post"`` (Post-LN, the original Transformer's placement; Xiong et al.,
    2020, compare the two):

    .. math:: x \leftarrow N_1(\alpha x + \mathrm{Attn}(x)), \qquad
              x \leftarrow N_2(\alpha x + \mathrm{MLP}(x))

    where ``alpha`` is DeepNorm's (Wang et al., 2022; ``config.deepnorm``) or 1. With
    ``position="peri"`` (a norm on each sublayer's input and output: Gemma 2's "sandwich",
    Peri-LN of Kim et al., 2025) and ``position="output"`` (OLMo 2's reordered norm, on the
    sublayer's output only):

    .. math:: x \leftarrow x + M_1(\mathrm{Attn}(N_1(x))), \qquad
              x \leftarrow x + M_2(\mathrm{MLP}(N_2(x)))
              \qquad\text{and}\qquad
              x \leftarrow x + N_1(\mathrm{Attn}(x)), \qquad x \leftarrow x + N_2(\mathrm{MLP}(x))

    With ``position="rezero"`` (Bachlechner et al., 2021) the blocks have no norm; each branch
    is scaled by its own learnt scalar, ``alpha_attn`` and ``alpha_mlp``, initialized at 0, so
    that every block starts as the identity:

    .. math:: x \leftarrow x + \alpha_1 \mathrm{Attn}(x), \qquad
              x \leftarrow x + \alpha_2 \mathrm{MLP}(x)

    The norms (``norm1``, ``norm2``; ``out_norm1``, ``out_norm2`` for ``"peri"``) come from
    :func:`make_norm`, times ``1 / sqrt(layer)`` with ``depth_scaling``; projections are
    Xavier-normal (DeepNorm: gain ``beta`` for v, out, fc1, fc2), biases 0. ``layer`` is the
    depth from 1.

    Shape: input and output ``(B, T, D)``.
    """

    def __init__(self, config: TransformerConfig, *, layer: int = 1, device: Device = None,
                 dtype: Dtype = None) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError("Block takes the model's TransformerConfig, Block(config, layer=l), "
                            f"got {type(config).__name__}; or take Transformer(config).blocks"
                            "[l - 1]")
        alpha, beta = deepnorm_constants(config.n_layers) if config.deepnorm else (None, None)
        self.config, self.layer = config, check_size("layer", layer)
        self.norm_kind, self.position = config.norm, config.position
        self.deepnorm_alpha, self.deepnorm_beta = alpha, beta
        kw = {"device": device, "dtype": dtype}
        qk = functools.partial(make_norm, config, kind="layer", **kw)
        rezero = self.position == "rezero"  # no norm in the block, a gate per branch
        self.norm1 = nn.Identity() if rezero else make_norm(config, **kw)
        self.attn = SelfAttention(config.d_model, config.n_heads,
                                  qk_norm=qk if config.qk_norm else False,
                                  dropout=config.dropout, causal=config.causal, bias=config.bias,
                                  sink=config.attn_sink, clip=config.attn_clip,
                                  gate=config.attn_gate, **kw)
        self.norm2 = nn.Identity() if rezero else make_norm(config, **kw)
        self.mlp = MLP(config.d_model, config.d_ff, bias=config.bias, **kw)
        if rezero:
            self.alpha_attn = nn.Parameter(torch.zeros((), **kw))
            self.alpha_mlp = nn.Parameter(torch.zeros((), **kw))
        if self.position == "peri":
            self.out_norm1, self.out_norm2 = make_norm(config, **kw), make_norm(config, **kw)
        self.dropout = nn.Dropout(config.dropout)
        self.scale = 1 / math.sqrt(self.layer) if config.depth_scaling else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal projections (gain ``deepnorm_beta`` for v, out, fc1, fc2), zero biases,
        norms reset (gains 1, biases 0, DyT alpha to its initial value), ReZero gates 0."""
        beta = 1.0 if self.deepnorm_beta is None else self.deepnorm_beta
        a = self.attn
        for lin, gain in ((a.q_proj, 1.0), (a.k_proj, 1.0), (a.v_proj, beta),
                          (a.out_proj, beta), (self.mlp.fc1, beta), (self.mlp.fc2, beta)):
            nn.init.xavier_normal_(lin.weight, gain=gain)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        a.reset_options()
        if self.position == "rezero":
            nn.init.zeros_(self.alpha_attn)
            nn.init.zeros_(self.alpha_mlp)
        out_norms = (self.out_norm1, self.out_norm2) if self.position == "peri" else ()
        for m in (self.norm1, self.norm2, a.q_norm, a.k_norm, *out_norms):
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _norm(self, norm: nn.Module, x: Tensor) -> Tensor:
        """``norm(x)``, times ``1 / sqrt(layer)`` with LayerNorm Scaling."""
        y = norm(x)
        return y if self.scale is None else y * self.scale

    def attention_logits(self, x: Tensor) -> Tensor:
        """The attention logits ``(B, H, T, T)`` this block computes for its input ``x``
        ``(B, T, D)`` (through ``norm1`` first when it normalizes the attention's input);
        masked positions hold ``-inf``."""
        pre = self.position in ("pre", "peri")
        return self.attn.logits(self._norm(self.norm1, x) if pre else x)

    def forward(self, x: Tensor) -> Tensor:
        n, drop = self._norm, self.dropout
        if self.position == "pre":
            x = x + drop(self.attn(n(self.norm1, x)))  # (B, T, D)
            return x + drop(self.mlp(n(self.norm2, x)))  # (B, T, D)
        if self.position == "peri":
            x = x + drop(n(self.out_norm1, self.attn(n(self.norm1, x))))  # (B, T, D)
            return x + drop(n(self.out_norm2, self.mlp(n(self.norm2, x))))  # (B, T, D)
        if self.position == "output":
            x = x + drop(n(self.norm1, self.attn(x)))  # (B, T, D)
            return x + drop(n(self.norm2, self.mlp(x)))  # (B, T, D)
        if self.position == "rezero":
            x = x + self.alpha_attn * drop(self.attn(x))  # (B, T, D)
            return x + self.alpha_mlp * drop(self.mlp(x))  # (B, T, D)
        alpha = 1.0 if self.deepnorm_alpha is None else self.deepnorm_alpha
        x = n(self.norm1, alpha * x + drop(self.attn(x)))  # (B, T, D)
        return n(self.norm2, alpha * x + drop(self.mlp(x)))  # (B, T, D)

    def extra_repr(self) -> str:
        s = f"norm={self.norm_kind!r}, position={self.position!r}"
        if self.scale is not None:
            s += f", layer={self.layer}, scale={self.scale:.4g}"
        for name in ("deepnorm_alpha", "deepnorm_beta"):
            if getattr(self, name) is not None:
                s += f", {name}={getattr(self, name):.4g}"
        return s


class Transformer(nn.Module):
    r"""A stack of :class:`Block` layers between token + position embeddings and a linear head.

    ``logits = head(N_f(x_L))``, ``x_0 = E_tok[idx] + E_pos[t]``, ``x_{l+1} = Block_l(x_l)``;
    ``N_f`` per :meth:`TransformerConfig.has_final_norm`. Embeddings N(0, 1), projections
    Xavier-normal, biases 0. ``Transformer(vocab_size, d_model, n_heads, n_layers, max_len,
    **fields)`` is shorthand for ``Transformer(TransformerConfig(...))``.

    Shape: token ids ``(B, T)`` (int64, ``T <= max_len``) in, logits ``(B, T, V)`` out.
    """

    def __init__(self, config: TransformerConfig | int, *sizes: int, device: Device = None,
                 dtype: Dtype = None, **fields: object) -> None:
        super().__init__()
        if isinstance(config, TransformerConfig):
            if sizes or fields:
                raise TypeError("pass either a TransformerConfig or its fields, not both")
            cfg = replace(config)  # the model's own copy, checked again
        else:
            cfg = TransformerConfig(config, *sizes, **fields)  # type: ignore[arg-type]
        self.config = cfg
        kw = {"device": device, "dtype": dtype}
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model, **kw)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model, **kw)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, layer=i + 1, **kw) for i in range(cfg.n_layers))
        self.final_norm = make_norm(cfg, **kw) if cfg.has_final_norm() else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.bias, **kw)
        self.reset_parameters()

    @classmethod
    def from_config(cls, config: TransformerConfig, device: Device = None,
                    dtype: Dtype = None) -> Transformer:
        """``Transformer(config, device=device, dtype=dtype)``: a freshly initialized model."""
        return cls(config, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """Embeddings N(0, 1), head Xavier-normal with bias 0, every block reset."""
        nn.init.normal_(self.tok_emb.weight)
        nn.init.normal_(self.pos_emb.weight)
        nn.init.xavier_normal_(self.head.weight)
        if self.head.bias is not None:
            nn.init.zeros_(self.head.bias)
        for block in self.blocks:
            block.reset_parameters()
        if hasattr(self.final_norm, "reset_parameters"):
            self.final_norm.reset_parameters()

    def embed(self, idx: Tensor) -> Tensor:
        """``x_0``: token plus position embeddings of ids ``(B, T)``, shape ``(B, T, D)``."""
        if not isinstance(idx, Tensor) or idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(
                f"token ids must be an int64 (or int32) tensor of shape (B, T), got "
                f"{type(idx).__name__ if not isinstance(idx, Tensor) else idx.dtype}"
            )
        if idx.dim() != 2:
            raise ShapeError(f"token ids must have shape (B, T), got {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.config.max_len:
            raise ValueError(
                f"sequence length {t} exceeds max_len={self.config.max_len} of the position "
                "embedding"
            )
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got values in "
                f"[{int(idx.min())}, {int(idx.max())}]"
            )
        pos = torch.arange(t, device=idx.device)  # (T,)
        return self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, D)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.embed(idx)  # (B, T, D)
        for block in self.blocks:
            x = block(x)  # (B, T, D)
        return self.head(self.final_norm(x))  # (B, T, V)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"norm={c.norm!r}, position={c.position!r}, qk_norm={c.qk_norm}, "
            f"final_norm={c.has_final_norm()}, deepnorm={c.deepnorm}"
        )


def sequence_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits ``(B, T, V)`` over targets ``(B, T)`` ``!= IGNORE_INDEX``."""
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, T, V) and targets (B, T), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def _blocks(model: Transformer | Block) -> list[Block]:
    if isinstance(model, Block):
        return [model]
    if isinstance(model, Transformer):
        return list(model.blocks)
    raise TypeError(f"expected a lnbook Transformer or Block, got {type(model).__name__}")


def max_attention_logits(model: Transformer | Block) -> list[float]:
    """The largest attention logit of each block in the most recent forward pass (claim P08);
    RuntimeError when a block has not run one."""
    out = []
    for i, block in enumerate(_blocks(model)):
        if block.attn.last_max_logit is None:
            raise RuntimeError(f"block {i} has not run a forward pass yet: call the model first")
        out.append(float(block.attn.last_max_logit))
    return out


def layer_gradient_norms(model: Transformer, inputs: Tensor,
                         targets: Tensor) -> list[dict[str, float]]:
    """Norms of the gradient of :func:`sequence_loss` per block, one batch (claims P04-P05;
    ``.grad`` untouched). One dict per block: each parameter by name, and the groups
    ``"attention"``, ``"ffn"``, ``"norms"`` and ``"block"``."""
    blocks = _blocks(model)
    named = [[(n, p) for n, p in b.named_parameters() if p.requires_grad] for b in blocks]
    params = [p for per_block in named for _, p in per_block]
    loss = sequence_loss(model(inputs), targets)
    grads = iter(torch.autograd.grad(loss, params, allow_unused=True))
    out = []
    for per_block in named:
        norms: dict[str, float] = {}
        groups = {"attention": 0.0, "ffn": 0.0, "norms": 0.0, "block": 0.0}
        for name, _ in per_block:
            g = next(grads)
            sq = 0.0 if g is None else float(g.detach().double().square().sum())
            norms[name] = math.sqrt(sq)
            group = {"attn": "attention", "mlp": "ffn"}.get(name.split(".")[0], "norms")
            groups[group] += sq
            groups["block"] += sq
        norms.update({k: math.sqrt(v) for k, v in groups.items()})
        out.append(norms)
    return out


def norm_inputs_outputs(model: nn.Module, inputs: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """``{name: (input, output)}`` of every norm layer in one no-grad forward, detached, in
    the order they ran (claim P11's S-shaped curves)."""
    found: dict[str, tuple[Tensor, Tensor]] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, (LayerNorm, RMSNorm, DyT, nn.LayerNorm, nn.RMSNorm)):
            def hook(mod: nn.Module, args: tuple, out: Tensor, name: str = name) -> None:
                found[name] = (args[0].detach(), out.detach())
            handles.append(module.register_forward_hook(hook))
    run_hooked(model, inputs, handles)
    return found


def run_hooked(model: nn.Module, inputs: Tensor, handles: list) -> None:
    """One no-grad forward of ``model`` on ``inputs``, then remove the hooks ``handles``."""
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for h in handles:
            h.remove()


def residual_stream(model: Transformer, inputs: Tensor) -> list[Tensor]:
    """The residual stream ``[x_0, ..., x_L]``, each ``(B, T, D)``, detached (no grad)."""
    with torch.no_grad():
        x = model.embed(inputs)  # (B, T, D)
        stream = [x]
        for block in model.blocks:
            x = block(x)  # (B, T, D)
            stream.append(x)
    return stream


def _check_pre_ln(model: Transformer, what: str) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(f"{what} expects a lnbook Transformer, got {type(model).__name__}")
    c = model.config
    if (c.position != "pre" or c.norm != "layer" or not c.has_final_norm()
            or c.depth_scaling):
        raise ValueError(
            f"{what} needs a Pre-LN Transformer (position='pre', norm='layer', with a final "
            f"norm, no depth_scaling), got position={c.position!r}, norm={c.norm!r}, "
            f"final_norm={c.has_final_norm()}, depth_scaling={c.depth_scaling}"
        )


def center_residual_stream_(model: Transformer) -> Transformer:
    """Make a Pre-LN model's residual stream mean-free in place, its function unchanged
    (Jiang et al., 2023): embeddings and the outputs of ``out_proj``, ``fc2`` lose their mean
    over ``D``; every reader is a layer norm. Returns ``model``."""
    _check_pre_ln(model, "center_residual_stream_")
    with torch.no_grad():
        for emb in (model.tok_emb, model.pos_emb):
            emb.weight.sub_(emb.weight.mean(dim=1, keepdim=True))  # (V or max_len, D) rows
        for block in model.blocks:
            for lin in (block.attn.out_proj, block.mlp.fc2):
                lin.weight.sub_(lin.weight.mean(dim=0, keepdim=True))  # (D, in) columns
                if lin.bias is not None:
                    lin.bias.sub_(lin.bias.mean())
    return model


def to_pre_rmsnorm(model: Transformer) -> Transformer:
    """A new Pre-RMSNorm Transformer computing the same function as a Pre-LN one (claim P03;
    Jiang et al., 2023): on a centred copy each LN equals an RMSNorm plus its bias, which is
    folded into the readers, ``W (y + b) + c = W y + (W b + c)`` (q, k, v; fc1; head)."""
    _check_pre_ln(model, "to_pre_rmsnorm")
    src = center_residual_stream_(copy.deepcopy(model))
    p = next(src.parameters())
    new = Transformer.from_config(replace(src.config, norm="rms"), device=p.device,
                                  dtype=p.dtype)
    state = {k: v.clone() for k, v in src.state_dict().items()}
    readers = {}
    for i in range(src.config.n_layers):
        readers[f"blocks.{i}.norm1"] = [f"blocks.{i}.attn.{n}_proj" for n in "qkv"]
        readers[f"blocks.{i}.norm2"] = [f"blocks.{i}.mlp.fc1"]
    readers["final_norm"] = ["head"]
    for norm_name, linears in readers.items():
        b = state.pop(f"{norm_name}.bias", None)
        if b is None or not bool(b.any()):
            continue
        for lin in linears:
            if f"{lin}.bias" not in state:
                raise ValueError(
                    f"{norm_name} has a nonzero bias but {lin} has no bias to fold it into "
                    "(build the model with bias=True)"
                )
            state[f"{lin}.bias"] = state[f"{lin}.bias"] + state[f"{lin}.weight"] @ b
    new.load_state_dict(state)
    return new
