"""Invariances (Table 1) and the geometry of normalized GLMs (paper sections 4-5, eqs. 5-14 and
32-35; chapters 4, 5.1 and 5.2), computed from lnbook's layers in float64, never read from a
stored answer; and the recurrent dynamics of an LN-RNN (section 3.1, chapter 3.1, claim C05).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from lnbook.checks import check_choice, check_floating, check_shape, check_size, check_subset
from lnbook.norms import BatchNorm, LayerNorm, WeightNormLinear
from lnbook.rnn import LNRNNCell

__all__ = [
    "EPS", "METHODS", "TRANSFORMATIONS", "PAPER_TABLE_1", "normalized_layer", "transform",
    "invariance_changes", "invariance_table", "reparameterization_residual", "glm_log_probs",
    "glm_output_covariance", "glm_normalized_inputs", "fisher_information",
    "glm_fisher_closed_form", "metric", "glm_kl_divergence", "gain_direction",
    "weight_magnitude_direction", "weight_scaling_curvature", "DirectionChange",
    "direction_change_demo", "RecurrentDynamics", "recurrent_dynamics",
]

METHODS: tuple[str, ...] = ("batch", "weight", "layer")
"""The three normalization methods of Table 1."""

_ALL_METHODS: tuple[str, ...] = ("none", "input", "batch", "weight", "layer")

TRANSFORMATIONS: tuple[str, ...] = (
    "weight_matrix_rescaling", "weight_matrix_recentering", "weight_vector_rescaling",
    "dataset_rescaling", "dataset_recentering", "single_case_rescaling",
)
"""The six columns of Table 1, in the paper's order."""

PAPER_TABLE_1: dict[str, dict[str, bool]] = {
    "batch": dict(zip(TRANSFORMATIONS, (True, False, True, True, True, False), strict=True)),
    "weight": dict(zip(TRANSFORMATIONS, (True, False, True, False, False, False), strict=True)),
    "layer": dict(zip(TRANSFORMATIONS, (True, True, False, True, False, True), strict=True)),
}
"""Table 1 as printed in the paper, for comparison only (the computed table never reads it)."""

_FAMILIES = ("softmax", "bernoulli")
#: the eps inside the square root of BN and LN here; float64 keeps the invariances to ~1e-12
EPS = 1e-12


def _check_matrix(t: object, name: str, cols: int | None = None) -> None:
    check_floating(t, name)
    check_shape(t, (None, cols), name)  # a ShapeError, a ValueError


def normalized_layer(method: str, x: Tensor, weight: Tensor, gain: Tensor, bias: Tensor,
                     eps: float = EPS) -> Tensor:
    r"""The argument of f in eq. 5, ``g_i / sigma_i * (a_i - mu_i) + b_i``, ``a = x W^T``.

    ``method``: ``"batch"`` (statistics of unit i over the N cases, eq. 2), ``"weight"``
    (mu_i = 0, sigma_i = ||w_i||), ``"layer"`` (over the H units of a case, eq. 3), ``"none"``
    (``g * a + b``) or ``"input"`` (``g * (LN(x) W^T) + b``). Shapes: x ``(N, D)``, weight
    ``(H, D)``, gain and bias ``(H,)``; returns ``(N, H)``.
    """
    check_choice("method", method, _ALL_METHODS)
    _check_matrix(x, "x")
    _check_matrix(weight, "weight", cols=x.shape[1])
    h = weight.shape[0]
    for name, p in (("gain", gain), ("bias", bias)):
        if not isinstance(p, Tensor) or tuple(p.shape) != (h,):
            shape = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"{name} must be a tensor of shape ({h},) (one per row of weight), "
                             f"got {shape}")
    kw = {"dtype": x.dtype, "device": x.device}
    if method == "weight":
        with torch.random.fork_rng(devices=[]):  # its random init must not move the global RNG
            wn = WeightNormLinear(x.shape[1], h).to(**kw)
        return functional_call(wn, {"weight": weight, "gain": gain, "bias": bias}, (x,))
    if method == "input":
        ln_x = LayerNorm(x.shape[1], eps=eps, elementwise_affine=False)
        return gain * (ln_x(x) @ weight.T) + bias  # (N, H)
    a = x @ weight.T  # (N, H) summed inputs
    if method == "none":
        return gain * a + bias
    norm = LayerNorm(h, eps=eps) if method == "layer" else BatchNorm(h, eps=eps).train()
    return functional_call(norm.to(**kw), {"weight": gain, "bias": bias}, (a,))  # eq. 3, eq. 2


def transform(name: str, x: Tensor, weight: Tensor, generator: torch.Generator | None = None
              ) -> tuple[Tensor, Tensor]:
    """Apply one transformation of Table 1 (:data:`TRANSFORMATIONS`) to x ``(N, D)`` or W
    ``(H, D)``; returns the new ``(x, weight)``. W' = delta W; W' = W + 1 gamma^T (eq. 6);
    w_i' = delta_i w_i; x' = delta x; x' = x + c; x_n' = delta_n x_n (eq. 7). The factors are
    random (from ``generator``), positive and away from 1."""
    check_choice("transformation", name, TRANSFORMATIONS)
    _check_matrix(x, "x")
    _check_matrix(weight, "weight", cols=x.shape[1])
    kw = {"dtype": x.dtype, "device": x.device}
    (n, d), h = x.shape, weight.shape[0]

    def factors(*shape: int) -> Tensor:  # log-uniform in [1/4, 4], never close to 1
        u = torch.rand(*shape, generator=generator, **kw)
        sign = torch.where(torch.rand(*shape, generator=generator, **kw) < 0.5, -1.0, 1.0)
        return torch.exp(sign * (0.3 + 1.08 * u))

    if name == "weight_matrix_rescaling":
        return x, weight * factors(1)
    if name == "weight_matrix_recentering":
        gamma = torch.randn(d, generator=generator, **kw)  # (D,)
        return x, weight + gamma.unsqueeze(0)  # W + 1 gamma^T
    if name == "weight_vector_rescaling":
        return x, weight * factors(h, 1)  # (H, D)
    if name == "dataset_rescaling":
        return x * factors(1), weight
    if name == "dataset_recentering":
        return x + torch.randn(d, generator=generator, **kw), weight
    return x * factors(n, 1), weight  # single_case_rescaling


def _random_layer(seed: int, n: int, d: int, h: int) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    kw = {"dtype": torch.float64, "generator": gen}
    x = torch.randn(n, d, **kw) + torch.randn(d, **kw)  # (N, D), not centred
    w = torch.randn(h, d, **kw)  # (H, D)
    g = 0.5 + torch.rand(h, **kw)  # (H,)
    b = torch.randn(h, **kw)  # (H,)
    return x, w, g, b, gen


LayerFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def invariance_changes(seed: int = 0, methods: Sequence[str] = METHODS,
                       transformations: Sequence[str] = TRANSFORMATIONS, n: int = 64, d: int = 10,
                       h: int = 8, layers: Mapping[str, LayerFn] | None = None
                       ) -> dict[str, dict[str, float]]:
    """``{method: {transformation: ||h' - h|| / ||h||}}`` of :func:`normalized_layer` on random
    float64 data and weights from ``seed`` (``n`` cases, ``d`` inputs, ``h`` units), before and
    after :func:`transform`; ``layers`` adds ``name -> fn(x, weight, gain, bias)``."""
    layers = dict(layers or {})
    check_subset("methods", methods, _ALL_METHODS)
    check_subset("transformations", transformations, TRANSFORMATIONS)
    for name, fn in layers.items():
        if not callable(fn):
            raise TypeError(f"layers[{name!r}] must be callable fn(x, weight, gain, bias)")
    if min(n, d, h) < 2:
        raise ValueError(f"n, d and h must be >= 2, got n={n}, d={d}, h={h}")
    x, w, g, b, gen = _random_layer(seed, n, d, h)
    fns: dict[str, LayerFn] = {m: partial(normalized_layer, m) for m in methods} | layers
    out: dict[str, dict[str, float]] = {m: {} for m in fns}
    for t in transformations:
        x2, w2 = transform(t, x, w, generator=gen)  # the same transformation for every method
        for m, fn in fns.items():
            y, y2 = fn(x, w, g, b), fn(x2, w2, g, b)  # (N, H) each
            out[m][t] = float((y2 - y).norm() / y.norm())
    return out


def invariance_table(seed: int = 0, tol: float = 1e-8, methods: Sequence[str] = METHODS,
                     layers: Mapping[str, LayerFn] | None = None, n: int = 64, d: int = 10,
                     h: int = 8) -> dict[str, dict[str, bool]]:
    """Table 1, decided numerically: True where :func:`invariance_changes` is below ``tol``
    (far above float64 rounding, ~1e-15, far below a real change, ~0.1)."""
    if not (isinstance(tol, float | int) and 0 < tol < 1):
        raise ValueError(f"tol must be a number in (0, 1), got {tol!r}")
    changes = invariance_changes(seed=seed, methods=methods, layers=layers, n=n, d=d, h=h)
    return {m: {t: c < tol for t, c in row.items()} for m, row in changes.items()}


def reparameterization_residual(method: str, seed: int = 0, n: int = 512, d: int = 6,
                                h: int = 5) -> float:
    """How far a normalized layer is from an affine map of its input (section 4, claim C21):
    ``||y - fit||_F / ||y - mean(y)||_F`` of a least-squares affine fit on ``n`` random inputs
    (~1e-15 for an affine layer). ``"batch"`` uses statistics frozen from a separate batch."""
    check_choice("method", method, _ALL_METHODS)
    x, w, g, b, gen = _random_layer(seed, n, d, h)
    if method == "batch":
        bn = BatchNorm(h, eps=EPS, momentum=1.0).double().train()
        x_stats = torch.randn(n, d, generator=gen, dtype=torch.float64) + x.mean(0)
        with torch.no_grad():
            bn(x_stats @ w.T)  # momentum 1: running stats := this batch's statistics
        bn.eval()
        y = functional_call(bn, {"weight": g, "bias": b}, (x @ w.T,))  # (N, H)
    else:
        y = normalized_layer(method, x, w, g, b)  # (N, H)
    design = torch.cat([x, torch.ones(n, 1, dtype=x.dtype)], dim=1)  # (N, D + 1)
    coef = torch.linalg.lstsq(design, y).solution  # (D + 1, H)
    return float((y - design @ coef).norm() / (y - y.mean(0)).norm())


def _check_theta(theta: Tensor, x: Tensor, method: str) -> None:
    check_choice("method", method, ("none", "batch", "weight", "layer"))
    _check_matrix(x, "x")
    cols = x.shape[1] + (1 if method == "none" else 2)
    if not isinstance(theta, Tensor) or theta.dim() != 2 or theta.shape[1] != cols:
        shape = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
        layout = "[w_i, b_i]" if method == "none" else "[w_i, b_i, g_i]"
        raise ValueError(f"theta for method {method!r} and x of shape {tuple(x.shape)} must "
                         f"have shape (H, {cols}) with rows {layout}, got {shape}")


def glm_log_probs(theta: Tensor, x: Tensor, method: str = "none",
                  family: str = "softmax", eps: float = EPS) -> Tensor:
    """Log-probabilities of every outcome under a (normalized) GLM (eqs. 10 and 5).

    ``theta``: ``(H, D + 1)`` rows ``[w_i, b_i]`` for ``method="none"`` (eq. 12), else
    ``(H, D + 2)`` rows ``[w_i, b_i, g_i]`` (eq. 13); x ``(N, D)``. Returns ``(N, H)`` for
    ``family="softmax"``, ``(N, H, 2)`` for ``"bernoulli"`` (H independent logistic GLMs).
    ``eps``: inside the normalizations' square root (:func:`normalized_layer`).
    """
    check_choice("family", family, _FAMILIES)
    _check_theta(theta, x, method)
    d = x.shape[1]
    w, b = theta[:, :d], theta[:, d]  # (H, D), (H,)
    # the natural parameters a + b of eq. 10, normalized for the normalized GLMs, (N, H)
    z = (x @ w.T + b if method == "none"
         else normalized_layer(method, x, w, theta[:, d + 1], b, eps))
    if family == "softmax":
        return F.log_softmax(z, dim=1)
    return torch.stack([F.logsigmoid(-z), F.logsigmoid(z)], dim=-1)  # (N, H, 2)


def glm_output_covariance(theta: Tensor, x: Tensor, method: str = "none",
                          family: str = "softmax") -> Tensor:
    """Cov[y | x] of the GLM's output for each case (the prediction-error term), ``(N, H, H)``."""
    with torch.no_grad():
        logp = glm_log_probs(theta, x, method, family)
    if family == "softmax":
        p = logp.exp()  # (N, H)
        return torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)
    p = logp[..., 1].exp()  # (N, H)
    return torch.diag_embed(p * (1 - p))


def glm_normalized_inputs(theta: Tensor, x: Tensor, method: str) -> Tensor:
    """(a_i - mu_i) / sigma_i for each case and unit, ``(N, H)``: the gain's multiplier in eq. 5."""
    _check_theta(theta, x, method)
    d, ones = x.shape[1], theta.new_ones(theta.shape[0])  # (H,)
    if method == "none":
        return x @ theta[:, :d].T
    with torch.no_grad():
        return normalized_layer(method, x, theta[:, :d], ones, torch.zeros_like(ones))


def fisher_information(theta: Tensor, x: Tensor, method: str = "none",
                       family: str = "softmax", eps: float = EPS) -> Tensor:
    r"""The Fisher information matrix F(theta) of eq. 9, exactly, by autograd.

    .. math:: F = \frac{1}{N} \sum_n \sum_y P(y|x_n) \, s_{n,y} s_{n,y}^\top

    with scores ``s`` through lnbook's layers (for batch norm including mu and sigma's
    dependence on W, eq. 14). Rows in ``theta.flatten()`` order, vec([W, b, g]^T); returns
    ``(P, P)``, P = theta.numel(). O(N^2 H^2 D) work: for small models. ``eps``: inside the
    normalizations' square root; inputs scaled by ``c`` with ``eps`` scaled by ``c**2``
    normalize to exactly the same values.
    """
    check_choice("family", family, _FAMILIES)
    _check_theta(theta, x, method)
    flat = theta.detach().reshape(-1)

    def logp(v: Tensor) -> Tensor:
        return glm_log_probs(v.view_as(theta), x, method, family, eps).reshape(-1)

    jac = torch.autograd.functional.jacobian(logp, flat, vectorize=True)  # (N * outcomes, P)
    with torch.no_grad():
        p = logp(flat).exp()  # (N * outcomes,)
    return (jac.T * p) @ jac / x.shape[0]


def glm_fisher_closed_form(theta: Tensor, x: Tensor, family: str = "softmax") -> Tensor:
    r"""Eq. 12, the plain GLM's Fisher matrix in closed form (phi = 1, order vec([W, b]^T)).

    .. math:: F = E_x[\mathrm{Cov}[y|x] / \phi^2 \otimes [x; 1][x; 1]^\top]
    """
    _check_theta(theta, x, "none")
    cov = glm_output_covariance(theta, x, "none", family)  # (N, H, H)
    xt = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1)  # (N, D+1)
    outer = xt.unsqueeze(2) * xt.unsqueeze(1)  # (N, D+1, D+1)
    n, h, d1 = cov.shape[0], cov.shape[1], xt.shape[1]
    kron = cov[:, :, None, :, None] * outer[:, None, :, None, :]  # (N, H, D+1, H, D+1)
    return kron.reshape(n, h * d1, h * d1).mean(0)


def metric(fisher: Tensor, direction: Tensor) -> float:
    """The Riemannian metric ds^2 = 1/2 delta^T F delta of eq. 8 (``direction`` flattened)."""
    if not isinstance(fisher, Tensor) or fisher.dim() != 2 or fisher.shape[0] != fisher.shape[1]:
        raise ValueError("fisher must be a square (P, P) matrix")
    delta = direction.reshape(-1).to(fisher.dtype)
    if delta.numel() != fisher.shape[0]:
        raise ValueError(f"direction has {delta.numel()} entries but fisher is "
                         f"{tuple(fisher.shape)}; give a direction shaped like theta")
    return float(0.5 * delta @ fisher @ delta)


def glm_kl_divergence(theta: Tensor, delta: Tensor, x: Tensor, method: str = "none",
                      family: str = "softmax") -> float:
    """E_x KL[P(y|x; theta) || P(y|x; theta + delta)], exactly: the left side of eq. 8."""
    if not isinstance(delta, Tensor) or delta.shape != theta.shape:
        raise ValueError(f"delta must have theta's shape {tuple(theta.shape)}")
    with torch.no_grad():
        lp = glm_log_probs(theta, x, method, family)
        lq = glm_log_probs(theta + delta, x, method, family)
    kl = (lp.exp() * (lp - lq)).reshape(x.shape[0], -1).sum(1)  # (N,), units add up for bernoulli
    return float(kl.mean())


def gain_direction(theta: Tensor, delta_g: Tensor) -> Tensor:
    """The direction vec([0, 0, delta_g]^T) of eqs. 32-34: only the gains move."""
    if not isinstance(delta_g, Tensor) or tuple(delta_g.shape) != (theta.shape[0],):
        raise ValueError(f"delta_g must have shape ({theta.shape[0]},), one entry per unit")
    out = torch.zeros_like(theta)
    out[:, -1] = delta_g
    return out


def weight_magnitude_direction(theta: Tensor, delta_g: Tensor) -> Tensor:
    """The plain-GLM direction of eq. 35: row i moves by delta_g_i w_i / ||w_i|| (b fixed)."""
    if not isinstance(delta_g, Tensor) or tuple(delta_g.shape) != (theta.shape[0],):
        raise ValueError(f"delta_g must have shape ({theta.shape[0]},), one entry per unit")
    w = theta[:, :-1]
    out = torch.zeros_like(theta)
    out[:, :-1] = delta_g.unsqueeze(1) * w / w.norm(dim=1, keepdim=True)
    return out


def weight_scaling_curvature(theta: Tensor, x: Tensor, method: str, factor: float = 2.0,
                             unit: int = 0, family: str = "softmax", seed: int = 0
                             ) -> dict[str, float]:
    """Curvature along a weight direction before and after scaling the weights (section 5.2.2).

    w_``unit`` (batch, weight) or all of W (layer) is multiplied by ``factor``. Returns ds^2
    along one random direction ``"before"``, ``"after"``, their ``"ratio"``, the gradient-norm
    ``"grad_ratio"``, the largest change of any log-probability, ``"output_change"``, and the
    most that ``eps`` lets it change, ``"eps_bound"``. Scaling makes a scaled unit's
    ``a / sqrt(var + eps)`` into ``a / sqrt(var + eps / factor**2)``, the relative change
    ``sqrt(r) - 1`` with ``r - 1 = eps (1 - factor**-2) / (var + eps / factor**2)``, largest at
    the smallest variance a scaled unit is divided by (weight normalization has no ``eps``:
    0). The argument of eq. 5, ``g * a_hat + b``, moves by that times ``|g * a_hat|``, and a
    log-probability by at most as much (``"bernoulli"``) or twice as much (``"softmax"``).
    Rounding comes on top, except for a power-of-two ``factor``, which scales exactly.
    """
    check_choice("method", method, ("batch", "weight", "layer"))
    _check_theta(theta, x, method)
    if not (isinstance(unit, int) and 0 <= unit < theta.shape[0]):
        raise ValueError(f"unit must be an int in [0, {theta.shape[0]}), got {unit!r}")
    if not (isinstance(factor, float | int) and factor > 0):
        raise ValueError(f"factor must be a positive number, got {factor!r}")
    d = x.shape[1]
    rows = slice(None) if method == "layer" else slice(unit, unit + 1)
    scaled = theta.detach().clone()
    scaled[rows, :d] *= factor
    gen = torch.Generator().manual_seed(seed)
    delta = torch.zeros_like(theta)
    delta[rows, :d] = torch.randn(delta[rows, :d].shape, generator=gen, dtype=theta.dtype)
    before = metric(fisher_information(theta, x, method, family), delta)
    after = metric(fisher_information(scaled, x, method, family), delta)

    def grad_norm(t: Tensor) -> float:  # gradient of a fixed log-likelihood (outcome 0 always)
        t = t.detach().clone().requires_grad_(True)
        lp = glm_log_probs(t, x, method, family)
        target = lp[:, 0] if family == "softmax" else lp[..., 0].sum(1)  # (N,)
        (grad,) = torch.autograd.grad(target.mean(), t)
        return float(grad[rows, :d].norm())

    with torch.no_grad():
        change = glm_log_probs(scaled, x, method, family) - glm_log_probs(theta, x, method, family)
        a = x @ theta[:, :d].T  # (N, H) summed inputs before scaling
        var = a.var(1, unbiased=False) if method == "layer" else a[:, rows].var(0, unbiased=False)
        g_a_hat = theta[rows, d + 1] * glm_normalized_inputs(theta, x, method)[:, rows]
        r1 = EPS * (1 - factor**-2) / (var.min() + EPS / factor**2)  # r - 1
        rel = r1.abs() / ((1 + r1).sqrt() + 1)  # |sqrt(r) - 1|, without cancellation
        bound = (2 if family == "softmax" else 1) * rel * g_a_hat.abs().max()
    return {"before": before, "after": after, "ratio": after / before,
            "grad_ratio": grad_norm(scaled) / grad_norm(theta),
            "output_change": float(change.abs().max()),
            "eps_bound": 0.0 if method == "weight" else float(bound)}


@dataclass
class DirectionChange:
    """Result of :func:`direction_change_demo`: per initial scale ``k`` and step ``t``, the
    angle (degrees) of W to the initial W, its Frobenius norm and the training loss."""

    scales: list[float]
    angles: list[list[float]]
    norms: list[list[float]]
    losses: list[list[float]]


def direction_change_demo(scales: Sequence[float] = (1.0, 2.0, 4.0), method: str = "layer",
                          steps: int = 50, lr: float = 0.5, n: int = 256, d: int = 8, h: int = 4,
                          seed: int = 0) -> DirectionChange:
    """Full-batch GD on a normalized softmax GLM from the same function at several weight norms
    (W times each of ``scales``): a larger norm turns its direction more slowly (5.2.2)."""
    check_choice("method", method, ("batch", "weight", "layer"))
    if not scales or any(not (isinstance(s, float | int) and s > 0) for s in scales):
        raise ValueError(f"scales must be a non-empty sequence of positive numbers, got {scales!r}")
    check_size("steps", steps)
    gen = torch.Generator().manual_seed(seed)
    kw = {"dtype": torch.float64, "generator": gen}
    x = torch.randn(n, d, **kw)  # (N, D)
    teacher = torch.randn(h, d, **kw) * 2.0
    labels = torch.argmax(x @ teacher.T + 0.5 * torch.randn(n, h, **kw), dim=1)  # (N,)
    theta0 = torch.cat([torch.randn(h, d, **kw), torch.zeros(h, 1, dtype=torch.float64),
                        torch.ones(h, 1, dtype=torch.float64)], dim=1)  # (H, D + 2)
    res = DirectionChange(scales=[float(s) for s in scales], angles=[], norms=[], losses=[])
    w0 = theta0[:, :d].reshape(-1)
    for s in scales:
        theta = theta0.clone()
        theta[:, :d] *= s
        theta.requires_grad_(True)
        angles, norms, losses = [], [], []
        for t in range(steps + 1):
            loss = F.nll_loss(glm_log_probs(theta, x, method, "softmax"), labels)
            w = theta.detach()[:, :d].reshape(-1)
            cos = float(w @ w0 / (w.norm() * w0.norm()))
            angles.append(math.degrees(math.acos(max(-1.0, min(1.0, cos)))))
            norms.append(float(w.norm()))
            losses.append(float(loss.detach()))
            if t == steps:
                break
            (grad,) = torch.autograd.grad(loss, theta)
            with torch.no_grad():
                theta -= lr * grad
        res.angles.append(angles)
        res.norms.append(norms)
        res.losses.append(losses)
    return res


class RecurrentDynamics(NamedTuple):
    """Per-step measurements of :func:`recurrent_dynamics`, each a float64 tensor ``(T,)``."""

    summed_input_rms: Tensor  # root mean square of a_t over units and batch
    hidden_rms: Tensor  # root mean square of h_t
    grad_norm: Tensor  # ||dL/dh_t|| averaged over the batch, L = sum of h_T


def recurrent_dynamics(cell: LNRNNCell, x: Tensor, h0: Tensor | None = None) -> RecurrentDynamics:
    """Run ``cell`` over x ``(T, B, input_size)`` (h0 ``(B, H)`` or zeros) and record, per step,
    the size of the summed inputs a_t = W_ih x_t + W_hh h_{t-1} (eq. 4), of h_t and of
    dL/dh_t for L = sum(h_T) (claim C05).
    """
    if not isinstance(cell, LNRNNCell):
        raise TypeError(f"cell must be an lnbook.LNRNNCell, got {type(cell).__name__}")
    check_floating(x, "x")
    if x.dim() != 3 or x.shape[-1] != cell.input_size:
        raise ValueError(f"x must have shape (T, B, {cell.input_size}), got {tuple(x.shape)}")
    T, B = x.shape[0], x.shape[1]
    h = x.new_zeros(B, cell.hidden_size) if h0 is None else h0  # (B, H)
    act = torch.tanh if cell.nonlinearity == "tanh" else torch.relu
    b = None if cell.bias_ih is None else cell.bias_ih + cell.bias_hh  # (H,)
    a_rms, h_rms, hs = [], [], []
    with torch.enable_grad():
        for t in range(T):
            a = F.linear(x[t], cell.weight_ih) + F.linear(h, cell.weight_hh)  # (B, H)
            z = a if cell.ln is None else cell.ln(a)  # (B, H)
            h = act(z if b is None else z + b)  # (B, H)
            hs.append(h)
            a_rms.append(a.detach().pow(2).mean().sqrt())
            h_rms.append(h.detach().pow(2).mean().sqrt())
        dh = torch.autograd.grad(hs[-1].sum(), hs)  # d(sum h_T) / d h_t, each (B, H)
    grads = [g.norm(dim=1).mean() for g in dh]
    return RecurrentDynamics(*(torch.stack(v).double() for v in (a_rms, h_rms, grads)))
