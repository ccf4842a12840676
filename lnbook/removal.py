"""The layer norms of a trained model replaced by fixed scales (chapter `16_removing_ln`, P19)."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from lnbook.checks import check_floating
from lnbook.norms import LayerNorm
from lnbook.transformer import run_hooked

__all__ = ["FixedScale", "norm_names", "norm_input_scales", "replace_norm", "remove_norms"]


class FixedScale(nn.Module):
    r"""Layer norm with its per-token standard deviation replaced by one fixed number.

    .. math:: y = \frac{x - \mu(x)}{s} \odot g + b

    with ``s`` a constant buffer (> 0; typically from :func:`norm_input_scales`), ``center``
    subtracting the token's mean :math:`\mu(x)`. Shape: ``(*, D)`` in and out.
    """

    def __init__(self, normalized_shape: int, scale: float, center: bool = True) -> None:
        super().__init__()
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale!r}")
        self.normalized_shape, self.center = int(normalized_shape), bool(center)
        self.register_buffer("scale", torch.tensor(float(scale)))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def reset_parameters(self) -> None:
        """Gain 1, bias 0 (the scale is kept)."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        check_floating(x, "input")
        if x.shape[-1] != self.normalized_shape:
            raise ValueError(f"input's last dimension must be {self.normalized_shape}, got "
                             f"shape {tuple(x.shape)}")
        if self.center:
            x = x - x.mean(dim=-1, keepdim=True)
        return x / self.scale * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, scale={float(self.scale):.4g}, center={self.center}"


def norm_names(model: nn.Module) -> list[str]:
    """Names of the :class:`lnbook.LayerNorm` and ``torch.nn.LayerNorm`` modules of ``model``,
    in the order of ``named_modules`` (query/key norms included)."""
    return [n for n, m in model.named_modules() if isinstance(m, LayerNorm | nn.LayerNorm)]


def norm_input_scales(model: nn.Module, inputs: Tensor,
                      names: Iterable[str] | None = None) -> dict[str, float]:
    r"""For each named norm, the mean over tokens of :math:`\sqrt{\sigma^2 + \epsilon}` of its
    input, on one forward pass of ``inputs`` (no gradient; the model's mode is kept)."""
    names = norm_names(model) if names is None else list(names)
    seen: dict[str, float] = {}
    hooks = []
    for name in names:
        def hook(m: nn.Module, args: tuple[Tensor, ...], name: str = name) -> None:
            x = args[0].detach().double()
            var = x.var(dim=-1, unbiased=False)
            seen[name] = float(torch.sqrt(var + getattr(m, "eps", 0.0)).mean())

        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    run_hooked(model, inputs, hooks)
    missing = [n for n in names if n not in seen]
    if missing:
        raise ValueError(f"norms {missing} were not called by the forward pass")
    return seen


def replace_norm(model: nn.Module, name: str, scale: float) -> FixedScale:
    """Replace the layer norm ``name`` of ``model`` (in place) by a :class:`FixedScale` with
    scale ``scale`` and the norm's gain and bias (copied); returns the new module."""
    old = model.get_submodule(name)
    if not isinstance(old, LayerNorm | nn.LayerNorm):
        raise TypeError(f"{name!r} is a {type(old).__name__}, not a layer norm")
    new = FixedScale(int(old.normalized_shape[-1]), scale)
    p = next(old.parameters(), None)
    new = new.to(p.device, p.dtype) if p is not None else new
    with torch.no_grad():
        for key in ("weight", "bias"):
            if getattr(old, key, None) is not None:
                getattr(new, key).copy_(getattr(old, key))
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)
    return new


def remove_norms(model: nn.Module, inputs: Tensor,
                 names: Iterable[str] | None = None) -> nn.Module:
    """A copy of ``model`` with the named layer norms (default: all) replaced by fixed scales
    measured on ``inputs`` (:func:`norm_input_scales`).
    """
    names = norm_names(model) if names is None else list(names)
    scales = norm_input_scales(model, inputs, names)
    out = copy.deepcopy(model)
    for name in names:
        replace_norm(out, name, scales[name])
    return out
