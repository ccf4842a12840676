"""A small, readable Transformer for the experiments of Part II ("layer normalization after 2016").

Decoder-style (causal by default) with learned token and position embeddings, a stack of
:class:`Block` layers and a linear head, in the flat style of nanoGPT: one
:class:`TransformerConfig` holds every choice, and :class:`Transformer` and :class:`Block` are
built from it. The choices the later papers argue about are fields of the config:

- ``norm``: which normalization sits in each block: ``"layer"`` (:class:`lnbook.LayerNorm`,
  the paper's eq. 3), ``"rms"`` (:class:`lnbook.RMSNorm`, Zhang and Sennrich 2019), ``"dyt"``
  (:class:`lnbook.DyT`, Zhu et al. 2025), ``"none"``, or any factory ``size -> module``;
  :func:`make_norm` is the one place a norm is made from the config;
- ``position``: ``"pre"`` (x + F(LN(x))) or ``"post"`` (LN(x + F(x)), Vaswani et al. 2017),
  compared by Xiong et al. (2020); ``"peri"`` (x + LN(F(LN(x))), the norms on both sides of
  each sublayer of Gemma 2 and Peri-LN) and ``"output"`` (x + LN(F(x)), OLMo 2's reordered
  norm); ``deepnorm`` gives Post-LN the up-weighted residual and down-scaled initialization of
  Wang et al. (2022); ``depth_scaling`` multiplies each block's norms by 1/sqrt(l) (LayerNorm
  Scaling, Sun et al. 2025);
- ``qk_norm``: layer-normalize queries and keys per head before their dot product
  (Dehghani et al. 2023; Wortsman et al. 2024).

Next to the model, the measurements the chapters make: the largest attention logit of each
block (:func:`max_attention_logits`), gradient norms per layer (:func:`layer_gradient_norms`),
the inputs and outputs of every norm (:func:`norm_inputs_outputs`), and the Pre-LN to
Pre-RMSNorm conversion of Jiang et al. (2023) (:func:`center_residual_stream_`,
:func:`to_pre_rmsnorm`). Part II, chapters "RMSNorm", "Where the norm goes", "QK-norm" and
"Transformers without normalization".
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import ShapeError, check_choice, check_size, make_module
from lnbook.norms import LN_IMPL, LN_IMPLS, LayerNorm
from lnbook.variants import DyT, RMSNorm

__all__ = [
    "TransformerConfig",
    "SelfAttention",
    "MLP",
    "Block",
    "Transformer",
    "make_norm",
    "deepnorm_constants",
    "sequence_loss",
    "max_attention_logits",
    "layer_gradient_norms",
    "norm_inputs_outputs",
    "residual_stream",
    "center_residual_stream_",
    "to_pre_rmsnorm",
    "IGNORE_INDEX",
]

NormKind = Literal["layer", "rms", "dyt", "none"]
NormFactory = Callable[[int], nn.Module]
Position = Literal["pre", "post", "peri", "output"]
NORMS = ("layer", "rms", "dyt", "none")
POSITIONS = ("pre", "post", "peri", "output")
IGNORE_INDEX = -100  # targets with this value are not scored (torch's cross_entropy default)


@dataclass
class TransformerConfig:
    """Everything that defines a :class:`Transformer` (nanoGPT's ``GPTConfig``).

    Checked once, when it is made (and again by ``dataclasses.replace``).

    Attributes:
        vocab_size: number of token ids ``V``.
        d_model: width of the residual stream ``D``.
        n_heads: attention heads per block; must divide ``d_model``.
        n_layers: number of blocks ``L``.
        max_len: the longest sequence the position embedding covers.
        d_ff: hidden width of the feed-forward networks; None for ``4 * d_model``.
        norm: ``"layer"``, ``"rms"``, ``"dyt"``, ``"none"``, or a factory ``size -> module``
            (``torch.nn.LayerNorm``, ``functools.partial(lnbook.RMSNorm, eps=1e-6)``, ...).
            Default: ``"layer"``.
        position: ``"pre"``, ``"post"``, ``"peri"`` or ``"output"`` (see :class:`Block`).
            Default: ``"pre"``.
        qk_norm: layer-normalize queries and keys per head. Default: False.
        final_norm: a norm after the last block; None (default) for the placement's usual
            choice (see :meth:`has_final_norm`).
        depth_scaling: LayerNorm Scaling: the output of each norm of block ``l`` (counted
            from 1; the final norm and query/key norms excluded) is multiplied by
            ``1 / sqrt(l)``. Default: False.
        dropout: dropout on attention weights, on each branch's output and on the embeddings,
            in [0, 1). Default: 0.
        causal: causal attention (a language model). Default: True.
        deepnorm: DeepNorm's residual weight and initialization (:func:`deepnorm_constants`;
            needs ``position="post"``). Default: False.
        eps: eps of the layer and RMS norms (queries' and keys' included). Default: 1e-5.
        dyt_alpha_init: initial ``alpha`` of DyT norms. Default: 0.5.
        bias: the linear layers have biases. Default: True.
        ln_impl: ``impl`` of every :class:`lnbook.LayerNorm`: ``"torch"``, torch's fused
            kernel, or ``"autograd"``, chapter 3's code; how the layer norms compute, not what
            (the same numbers to rounding). Default: :data:`lnbook.norms.LN_IMPL`.

    Example::

        >>> config = TransformerConfig(vocab_size=11, d_model=32, n_heads=4, n_layers=2,
        ...                            max_len=16, norm="rms")
        >>> model = Transformer(config)
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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_len"):
            setattr(self, name, check_size(name, getattr(self, name)))
        if self.d_ff is not None:
            self.d_ff = check_size("d_ff", self.d_ff)
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        if not callable(self.norm):
            check_choice("norm", self.norm, NORMS)
        check_choice("position", self.position, POSITIONS)
        check_choice("ln_impl", self.ln_impl, LN_IMPLS)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.deepnorm and self.position != "post":
            raise ValueError(
                f"deepnorm=True needs position='post', got position={self.position!r}")
        self.qk_norm, self.causal, self.deepnorm, self.bias = (
            bool(self.qk_norm), bool(self.causal), bool(self.deepnorm), bool(self.bias))
        self.depth_scaling = bool(self.depth_scaling)
        self.dropout, self.eps = float(self.dropout), float(self.eps)
        self.dyt_alpha_init = float(self.dyt_alpha_init)

    def has_final_norm(self) -> bool:
        """Whether a norm follows the last block: ``final_norm``, or the usual choice for the
        placement when it is None (Post-LN: no, its last block ends in a norm; the others:
        yes, as Pre-LN, Gemma 2 and OLMo 2 do)."""
        return self.position != "post" if self.final_norm is None else bool(self.final_norm)


def make_norm(
    config: TransformerConfig,
    size: int | None = None,
    *,
    kind: NormKind | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """The one place a Transformer's norms are made: ``config.norm`` over ``size`` features.

    ``"layer"`` is :class:`lnbook.LayerNorm` (gain and bias, ``eps``, ``impl=config.ln_impl``),
    ``"rms"`` :class:`lnbook.RMSNorm` (gain only), ``"dyt"`` :class:`lnbook.DyT` (no
    statistics, ``alpha`` starts at ``config.dyt_alpha_init``), ``"none"``
    :class:`torch.nn.Identity`; a factory in ``config.norm`` is called with ``size``.

    Args:
        config: the model's :class:`TransformerConfig`.
        size: the normalized width; None for ``config.d_model``.
        kind: a kind instead of ``config.norm`` (query/key norms are ``"layer"``).
        device, dtype: of the parameters.
    """
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
    """DeepNorm's ``(alpha, beta)`` for a decoder-only stack of ``n_layers`` blocks.

    Wang et al. (2022) give alpha = (2N)^(1/4) (the weight of the residual, x_{l+1} =
    LN(alpha x_l + G(x_l))) and beta = (8N)^(-1/4) (the gain of the initialization of the
    value, output and feed-forward projections) for a decoder-only model of N layers.
    """
    n = check_size("n_layers", n_layers)
    return (2 * n) ** 0.25, (8 * n) ** -0.25


class SelfAttention(nn.Module):
    r"""Multi-head self-attention with an explicit softmax (Vaswani et al., 2017, eq. 1).

    .. math:: \mathrm{softmax}\Big(\frac{Q K^\top}{\sqrt{d_h}}\Big) V

    per head, with ``Q, K, V`` from separate :class:`nn.Linear` projections and an output
    projection. With ``qk_norm`` the queries and keys are normalized over each head's ``d_h``
    features before the product (Dehghani et al., 2023); a layer norm bounds every logit by
    ``sqrt(d_h)`` times the product of the two gains. The logits are computed explicitly (not
    with a fused kernel) so that they can be read: every forward stores the largest one,
    detached, in ``last_max_logit`` (a 0-dim tensor; masked positions do not count).
    Part II, chapter "QK-norm and attention-logit growth" (claims P08-P09).

    Args:
        d_model: width of the residual stream ``D``.
        n_heads: number of heads ``H``; must divide ``d_model``.
        qk_norm: normalize queries and keys per head: True for :class:`lnbook.LayerNorm`
            (``impl`` :data:`lnbook.norms.LN_IMPL`), or a factory ``d_h -> module`` (for
            example ``functools.partial(lnbook.LayerNorm, eps=1e-6)``). Default: False.
        dropout: dropout on the attention weights. Default: 0.
        causal: position t attends to positions <= t only. Default: True.
        bias: the projections have biases. Default: True.
        device, dtype: of the parameters.

    Shape:
        - Input: ``(B, T, D)``; output: ``(B, T, D)``.

    Example::

        >>> attn = SelfAttention(32, 4, qk_norm=True)
        >>> y = attn(torch.randn(2, 16, 32))
        >>> float(attn.last_max_logit) <= 8 ** 0.5  # d_h = 8, gains 1
        True
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        qk_norm: bool | NormFactory = False,
        dropout: float = 0.0,
        causal: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **removed: object,
    ) -> None:
        super().__init__()
        if removed:
            raise TypeError(
                f"SelfAttention no longer takes {sorted(removed)}: pass the query/key norm as "
                "qk_norm=a factory d_h -> module, for example "
                "qk_norm=functools.partial(lnbook.LayerNorm, eps=1e-6, impl='autograd')")
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

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def logits(self, x: Tensor) -> Tensor:
        """The attention logits ``q . k / sqrt(d_h)`` of input ``x`` ``(B, T, D)``, shape
        ``(B, H, T, T)``; positions a causal head may not see hold ``-inf``."""
        return self._logits_and_values(x)[0]

    def _logits_and_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"attention expects input of shape (B, T, {self.d_model}), got {tuple(x.shape)}"
            )
        t = x.shape[1]
        q = self.q_norm(self._heads(self.q_proj(x)))  # (B, H, T, Dh)
        k = self.k_norm(self._heads(self.k_proj(x)))  # (B, H, T, Dh)
        v = self._heads(self.v_proj(x))  # (B, H, T, Dh)
        att = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, T)
        if self.causal:
            seen = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()  # (T, T)
            att = att.masked_fill(~seen, float("-inf"))  # (B, H, T, T)
        return att, v

    def forward(self, x: Tensor) -> Tensor:
        att, v = self._logits_and_values(x)  # (B, H, T, T), (B, H, T, Dh)
        b, t, d = x.shape
        self.last_max_logit = att.detach().amax()  # () masked entries are -inf
        att = self.attn_dropout(att.softmax(dim=-1))  # (B, H, T, T) rows sum to 1
        y = (att @ v).transpose(1, 2).reshape(b, t, d)  # (B, T, D) heads side by side
        return self.out_proj(y)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_head={self.d_head}, causal={self.causal}"


class MLP(nn.Module):
    """The position-wise feed-forward network ``fc2(gelu(fc1(x)))`` (Vaswani et al., 2017).

    Args:
        d_model: input and output width ``D``.
        d_ff: hidden width. Default: ``4 * d_model``.
        bias: the two linear layers have biases. Default: True.
        device, dtype: of the parameters.

    Shape:
        - Input: ``(*, D)``; output: ``(*, D)``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
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

    ``N_1``, ``N_2`` (``norm1``, ``norm2``) and, for ``"peri"``, ``M_1``, ``M_2``
    (``out_norm1``, ``out_norm2``) are made by :func:`make_norm` from the config; with
    ``config.depth_scaling`` each of their outputs is multiplied by ``1 / sqrt(layer)``
    (LayerNorm Scaling, Sun et al., 2025). Projections are :class:`nn.Linear`
    layers initialized Xavier-normal (biases 0); with DeepNorm the value, output and
    feed-forward projections get the gain ``beta``. Part II, chapters "Where the norm goes"
    (P04, P05, P10) and "QK-norm" (P08, P09).

    Args:
        config: the model's :class:`TransformerConfig` (``d_model``, ``n_heads``, ``d_ff``,
            ``norm``, ``position``, ``qk_norm``, ``dropout``, ``causal``, ``deepnorm`` with
            ``n_layers``, ``eps``, ``dyt_alpha_init``, ``bias``, ``ln_impl``).
        layer: the block's depth ``l``, from 1. Default: 1.
        device, dtype: of the parameters.

    The attributes ``deepnorm_alpha`` and ``deepnorm_beta`` hold DeepNorm's constants (None
    without DeepNorm). The former form ``Block(d_model, n_heads, d_ff, norm=..., ...)`` still
    builds the block, with a :class:`DeprecationWarning`.

    Shape:
        - Input: ``(B, T, D)``; output: ``(B, T, D)``.

    Example::

        >>> config = TransformerConfig(11, d_model=32, n_heads=4, n_layers=2, max_len=16,
        ...                            norm="rms")
        >>> y = Block(config)(torch.randn(2, 16, 32))
    """

    def __init__(
        self,
        config: TransformerConfig,
        *args: object,
        layer: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **legacy: object,
    ) -> None:
        super().__init__()
        alpha = beta = None
        if isinstance(config, TransformerConfig):
            if args or legacy:
                raise TypeError("Block(config, *, layer, device, dtype) takes its options from "
                                f"the config, got also {list(args) + sorted(legacy)}")
            if config.deepnorm:
                alpha, beta = deepnorm_constants(config.n_layers)
        else:
            config, alpha, beta = _legacy_block_config(config, *args, **legacy)
        self.config, self.layer = config, check_size("layer", layer)
        self.norm_kind, self.position = config.norm, config.position
        self.deepnorm_alpha, self.deepnorm_beta = alpha, beta
        kw = {"device": device, "dtype": dtype}
        qk = functools.partial(make_norm, config, kind="layer", **kw)
        self.norm1 = make_norm(config, **kw)
        self.attn = SelfAttention(config.d_model, config.n_heads,
                                  qk_norm=qk if config.qk_norm else False,
                                  dropout=config.dropout, causal=config.causal, bias=config.bias,
                                  **kw)
        self.norm2 = make_norm(config, **kw)
        self.mlp = MLP(config.d_model, config.d_ff, bias=config.bias, **kw)
        if self.position == "peri":
            self.out_norm1, self.out_norm2 = make_norm(config, **kw), make_norm(config, **kw)
        self.dropout = nn.Dropout(config.dropout)
        self.scale = 1 / math.sqrt(self.layer) if config.depth_scaling else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal projections (gain ``deepnorm_beta`` for v, out, fc1, fc2), zero biases,
        norms reset (gains 1, biases 0, DyT alpha to its initial value)."""
        beta = 1.0 if self.deepnorm_beta is None else self.deepnorm_beta
        a = self.attn
        for lin, gain in ((a.q_proj, 1.0), (a.k_proj, 1.0), (a.v_proj, beta),
                          (a.out_proj, beta), (self.mlp.fc1, beta), (self.mlp.fc2, beta)):
            nn.init.xavier_normal_(lin.weight, gain=gain)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for m in (self.norm1, self.norm2, a.q_norm, a.k_norm, *self._out_norms()):
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _out_norms(self) -> tuple[nn.Module, ...]:
        return (self.out_norm1, self.out_norm2) if self.position == "peri" else ()

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
        alpha = 1.0 if self.deepnorm_alpha is None else self.deepnorm_alpha
        x = n(self.norm1, alpha * x + drop(self.attn(x)))  # (B, T, D)
        return n(self.norm2, alpha * x + drop(self.mlp(x)))  # (B, T, D)

    def extra_repr(self) -> str:
        s = f"norm={self.norm_kind!r}, position={self.position!r}"
        if self.scale is not None:
            s += f", layer={self.layer}, scale={self.scale:.4g}"
        if self.deepnorm_alpha is not None:
            s += f", deepnorm_alpha={self.deepnorm_alpha:.4g}"
        if self.deepnorm_beta is not None:
            s += f", deepnorm_beta={self.deepnorm_beta:.4g}"
        return s


def _legacy_block_config(
    d_model: object, n_heads: object = None, d_ff: object = None, *,
    deepnorm_alpha: float | None = None, deepnorm_beta: float | None = None, **options: object,
) -> tuple[TransformerConfig, float | None, float | None]:
    """``Block(d_model, n_heads, d_ff, **options)``, the form before the config: its config
    (with placeholder vocabulary, depth and length, which a block does not use) and its
    explicit DeepNorm constants."""
    warnings.warn("Block(d_model, n_heads, ...) is deprecated: build a block from the model's "
                  "config, Block(TransformerConfig(...), layer=l), or take "
                  "Transformer(config).blocks[l - 1]", DeprecationWarning, stacklevel=3)
    for name, v in (("deepnorm_alpha", deepnorm_alpha), ("deepnorm_beta", deepnorm_beta)):
        if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be None or a finite number > 0, got {v!r}")
    config = TransformerConfig(1, d_model, n_heads, 1, 1, d_ff, **options)  # type: ignore[arg-type]
    if deepnorm_alpha is not None and config.position != "post":
        raise ValueError(
            "deepnorm_alpha weights the residual of a Post-LN block, LN(alpha x + G(x)); "
            f"it needs position='post', got position={config.position!r}"
        )
    return (config, None if deepnorm_alpha is None else float(deepnorm_alpha),
            None if deepnorm_beta is None else float(deepnorm_beta))


class Transformer(nn.Module):
    r"""A stack of :class:`Block` layers between token + position embeddings and a linear head.

    ``logits = head(N_f(x_L))`` with ``x_0 = E_tok[idx] + E_pos[t]`` and ``x_{l+1} =
    Block_l(x_l)``; ``N_f`` is a final norm of the same kind (by default present for Pre-LN
    and absent for Post-LN, whose last block already ends in a norm). Embeddings start
    N(0, 1) (torch's default), projections Xavier-normal, biases 0. With ``deepnorm=True``
    (Post-LN only) every block gets DeepNorm's alpha and beta for ``n_layers``
    (:func:`deepnorm_constants`). Small enough to train on a CPU in seconds at the book's sizes
    (``d_model`` 32-64, 2-4 layers, sequences of 16-32 tokens). Part II, chapters "RMSNorm",
    "Where the norm goes", "QK-norm" and "Transformers without normalization".

    Args:
        config: a :class:`TransformerConfig`, which the model keeps as ``config``. The
            shorthand ``Transformer(vocab_size, d_model, n_heads, n_layers, max_len,
            **fields)`` builds that config from its fields first.
        device, dtype: of the parameters (keyword-only).

    Shape:
        - Input: token ids ``(B, T)`` (int64, ``T <= max_len``); output: logits ``(B, T, V)``.

    Example::

        >>> config = TransformerConfig(vocab_size=11, d_model=32, n_heads=4, n_layers=2,
        ...                            max_len=16)
        >>> model = Transformer(config)
        >>> logits = model(torch.randint(0, 11, (8, 16)))
        >>> logits.shape
        torch.Size([8, 16, 11])
        >>> same = Transformer(11, 32, 4, 2, 16)  # the shorthand: the same config
    """

    def __init__(
        self,
        config: TransformerConfig | int,
        *sizes: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **fields: object,
    ) -> None:
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
    def from_config(
        cls,
        config: TransformerConfig,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> Transformer:
        """Build a fresh (newly initialized) model from a :class:`TransformerConfig`; the same
        as ``Transformer(config, device=device, dtype=dtype)``."""
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


# ---------------------------------------------------------------------------------------------
# What the chapters measure
# ---------------------------------------------------------------------------------------------


def sequence_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over the scored positions (targets ``!= IGNORE_INDEX``).

    Args:
        logits: ``(B, T, V)``.
        targets: int64 ``(B, T)``; ``-100`` marks a position that is not scored (the prompt
            part of the tasks of :mod:`lnbook.data`).
    """
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
    """The largest attention logit of each block in the model's most recent forward pass.

    Read after a forward (e.g. on a held-out batch, under ``torch.no_grad()``); one float per
    block, first block first. Wortsman et al. (2024) track this number to show attention-logit
    growth without qk-norm (claim P08).

    Raises:
        RuntimeError: when a block has not run a forward yet.
    """
    out = []
    for i, block in enumerate(_blocks(model)):
        if block.attn.last_max_logit is None:
            raise RuntimeError(f"block {i} has not run a forward pass yet: call the model first")
        out.append(float(block.attn.last_max_logit))
    return out


def layer_gradient_norms(
    model: Transformer, inputs: Tensor, targets: Tensor
) -> list[dict[str, float]]:
    """Euclidean norms of the loss gradient per block, for one batch (claims P04-P05).

    Computes :func:`sequence_loss` of ``model(inputs)`` against ``targets`` and its gradient
    with respect to every block parameter with :func:`torch.autograd.grad` (the ``.grad``
    fields are left untouched). Call it on a fresh model (at initialization) in ``eval()``
    mode if the model has dropout.

    Returns:
        One dict per block (first block first) with the norm of the gradient of every
        parameter by its name inside the block (``"attn.q_proj.weight"``, ``"mlp.fc2.weight"``,
        ...), and of the groups ``"attention"`` (all of ``attn``), ``"ffn"`` (all of ``mlp``),
        ``"norms"`` (``norm1``, ``norm2``; 0 without norms) and ``"block"`` (everything).
    """
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
    """Input and output of every norm layer (LayerNorm, RMSNorm, DyT) in one forward pass.

    For the S-shaped input-output curves of trained layer norms (Zhu et al., 2025; claim P11).
    Uses forward hooks that are removed before returning; runs under ``torch.no_grad()``.

    Returns:
        ``{module name: (input, output)}``, detached, in the order the layers ran
        (``"blocks.0.norm1"``, ..., ``"final_norm"``; query/key norms included).
    """
    found: dict[str, tuple[Tensor, Tensor]] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, (LayerNorm, RMSNorm, DyT, nn.LayerNorm, nn.RMSNorm)):
            def hook(mod: nn.Module, args: tuple, out: Tensor, name: str = name) -> None:
                found[name] = (args[0].detach(), out.detach())
            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for h in handles:
            h.remove()
    return found


def residual_stream(model: Transformer, inputs: Tensor) -> list[Tensor]:
    """The residual stream ``[x_0, x_1, ..., x_L]``: the embeddings and each block's output.

    Each entry ``(B, T, D)``, detached, computed under ``torch.no_grad()``. For the P03
    chapter: after :func:`center_residual_stream_` every entry has zero mean over ``D``.
    """
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
    """Make a Pre-LN model's residual stream mean-free, in place, without changing its function.

    Jiang et al. (2023): every write into the residual stream of a Pre-LN Transformer is the
    embedding or the output of a linear layer (``out_proj``, ``fc2``), and every read is a
    layer norm, which ignores the mean. Removing the mean over ``D`` from the embedding rows
    and from those layers' outputs (``W <- W - mean over output rows``, ``b <- b - mean(b)``)
    therefore leaves every norm's output, and the logits, as they were, while each ``x_l``
    becomes its own centred version (see :func:`residual_stream`). Exact up to rounding
    (dropout, which rescales entries at random, must be off).

    Returns:
        The same ``model``, modified.

    Raises:
        ValueError: for a model that is not Pre-LN with a final norm (there, the mean
            matters to whoever reads the stream).
    """
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
    """A Pre-RMSNorm Transformer that computes the same function as a Pre-LN one (claim P03).

    Jiang et al. (2023): once the residual stream is mean-free (:func:`center_residual_stream_`,
    applied to a copy), each layer norm ``g * (x - mean) / sqrt(var + eps) + b`` sees inputs
    of mean 0, where it equals ``g * x / sqrt(mean(x^2) + eps) + b``, an RMSNorm with the same
    gain and eps plus a bias. RMSNorm has no bias, so ``b`` is folded into the linear layers
    that read the norm: ``W (y + b) + c = W y + (W b + c)`` for the query, key and value
    projections (``norm1``), ``fc1`` (``norm2``) and the head (``final_norm``). Query/key
    norms (``qk_norm``) act inside attention, not on the stream, and stay layer norms.

    The input model is not modified. In float64 the two models agree to about 1e-12; in
    float32 to float32 rounding.

    Returns:
        A new :class:`Transformer` with ``norm="rms"`` and otherwise the same configuration,
        on the same device and in the same dtype.

    Raises:
        ValueError: for a model that is not Pre-LN with a final norm, or when a layer norm has
            a nonzero bias but the layer reading it has no bias to fold it into.
    """
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
