"""Tests for lnbook.analysis: Table 1 decided numerically; Fisher matrices against eqs. 8, 12-13."""

from __future__ import annotations

import math

import pytest
import torch

import lnbook
from lnbook import analysis as A

F64 = torch.float64


def _glm(seed: int, n: int = 60, d: int = 4, h: int = 3, gains: bool = True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=F64) + 0.5  # (N, D)
    theta = torch.randn(h, d + 1, generator=gen, dtype=F64)  # rows [w_i, b_i]
    if gains:
        g = 0.5 + torch.rand(h, 1, generator=gen, dtype=F64)
        theta = torch.cat([theta, g], dim=1)  # rows [w_i, b_i, g_i]
    return x, theta


# ---------------------------------------------------------------- section 5.1: Table 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_invariance_table_matches_paper_table_1(seed):
    table = A.invariance_table(seed=seed)
    assert set(table) == set(A.METHODS)
    for m in A.METHODS:
        assert table[m] == A.PAPER_TABLE_1[m], m


def test_invariance_changes_are_far_from_the_tolerance_on_both_sides():
    changes = A.invariance_changes(seed=3)
    for m in A.METHODS:
        for t, c in changes[m].items():
            if A.PAPER_TABLE_1[m][t]:
                assert c < 1e-10, (m, t, c)
            else:
                assert c > 1e-2, (m, t, c)


def test_a_layer_built_to_break_an_invariance_is_reported_not_invariant():
    # layer norm followed by a per-unit scaling that depends on the raw input norm: breaks
    # single-case re-scaling, which layer norm alone has
    def broken(x, w, g, b):
        return A.normalized_layer("layer", x, w, g, b) * x.norm(dim=1, keepdim=True)

    table = A.invariance_table(seed=0, layers={"broken": broken})
    assert table["layer"]["single_case_rescaling"] is True
    assert table["broken"]["single_case_rescaling"] is False
    assert table["broken"]["dataset_rescaling"] is False
    assert table["broken"]["weight_matrix_rescaling"] is True  # what it keeps


def test_plain_layer_has_no_invariance_and_input_norm_lacks_weight_invariances():
    table = A.invariance_table(seed=1, methods=("none", "input"))
    assert not any(table["none"].values())
    # C09: normalizing only the input gives no invariance to the weights
    for t in ("weight_matrix_rescaling", "weight_matrix_recentering", "weight_vector_rescaling"):
        assert table["input"][t] is False
    assert table["input"]["single_case_rescaling"] is True


def test_eq6_layer_norm_with_scaled_and_shifted_matrix_equals_original():
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(7, 5, generator=gen, dtype=F64), torch.randn(4, 5, generator=gen, dtype=F64)
    g, b = torch.rand(4, generator=gen, dtype=F64) + 0.5, torch.randn(4, generator=gen, dtype=F64)
    gamma = torch.randn(5, generator=gen, dtype=F64)
    w2 = 3.7 * w + gamma.unsqueeze(0)  # W' = delta W + 1 gamma^T
    y, y2 = A.normalized_layer("layer", x, w, g, b), A.normalized_layer("layer", x, w2, g, b)
    torch.testing.assert_close(y2, y, rtol=1e-10, atol=1e-10)


def test_normalized_layer_matches_explicit_formulas():
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(9, 5, generator=gen, dtype=F64), torch.randn(4, 5, generator=gen, dtype=F64)
    g, b = torch.rand(4, generator=gen, dtype=F64) + 0.5, torch.randn(4, generator=gen, dtype=F64)
    a = x @ w.T
    ln = g * (a - a.mean(1, keepdim=True)) / a.std(1, unbiased=False, keepdim=True) + b
    bn = g * (a - a.mean(0)) / a.std(0, unbiased=False) + b
    wn = g * a / w.norm(dim=1) + b
    torch.testing.assert_close(A.normalized_layer("layer", x, w, g, b), ln)
    torch.testing.assert_close(A.normalized_layer("batch", x, w, g, b), bn)
    torch.testing.assert_close(A.normalized_layer("weight", x, w, g, b), wn)
    torch.testing.assert_close(A.normalized_layer("none", x, w, g, b), g * a + b)


def test_normalized_layer_leaves_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    x, w = torch.ones(4, 3, dtype=F64), torch.ones(2, 3, dtype=F64)
    A.normalized_layer("weight", x, w, torch.ones(2, dtype=F64), torch.zeros(2, dtype=F64))
    assert torch.equal(torch.rand(3), expected)


def test_reparameterization_residual_affine_for_bn_wn_not_ln():
    for seed in range(2):
        assert A.reparameterization_residual("batch", seed=seed) < 1e-10
        assert A.reparameterization_residual("weight", seed=seed) < 1e-10
        assert A.reparameterization_residual("none", seed=seed) < 1e-10
        assert A.reparameterization_residual("layer", seed=seed) > 0.05


def test_bad_names_and_shapes_raise_value_error_listing_choices():
    with pytest.raises(ValueError, match="'batch', 'weight', 'layer'"):
        A.invariance_changes(methods=("group",))
    with pytest.raises(ValueError, match="weight_matrix_rescaling"):
        A.transform("rotate", torch.ones(3, 2, dtype=F64), torch.ones(2, 2, dtype=F64))
    with pytest.raises(ValueError, match="shape"):
        A.normalized_layer("layer", torch.ones(3, 2, dtype=F64), torch.ones(4, 5, dtype=F64),
                           torch.ones(4, dtype=F64), torch.zeros(4, dtype=F64))
    with pytest.raises(ValueError, match=r"\(4,\)"):
        A.normalized_layer("layer", torch.ones(3, 5, dtype=F64), torch.ones(4, 5, dtype=F64),
                           torch.ones(3, dtype=F64), torch.zeros(4, dtype=F64))
    x, theta = _glm(0)
    with pytest.raises(ValueError, match="'softmax', 'bernoulli'"):
        A.fisher_information(theta, x, "layer", family="poisson")
    with pytest.raises(ValueError, match=r"\(H, 5\)"):
        A.fisher_information(theta, x, "none")  # theta has a gain column: wrong for plain GLM
    with pytest.raises(ValueError, match="'none', 'batch', 'weight', 'layer'"):
        A.fisher_information(theta, x, "group")
    with pytest.raises(ValueError, match="direction"):
        A.metric(torch.eye(3, dtype=F64), torch.ones(4, dtype=F64))
    with pytest.raises(TypeError, match="floating"):
        A.normalized_layer("layer", torch.ones(3, 5, dtype=torch.long), torch.ones(4, 5),
                           torch.ones(4), torch.zeros(4))
    with pytest.raises(ValueError, match="tol"):
        A.invariance_table(tol=2.0)


@pytest.mark.parametrize("x, weight, error, match", [
    ("not a tensor", torch.ones(4, 5, dtype=F64), TypeError, "x must be a torch.Tensor"),
    (torch.ones(3, 5, dtype=F64), torch.ones(4, 5, dtype=torch.long), TypeError,
     "weight must be a floating-point tensor"),
    (torch.ones(3, 5, 1, dtype=F64), torch.ones(4, 5, dtype=F64), ValueError,
     r"x must have shape \(\*, \*\)"),
    (torch.ones(3, 5, dtype=F64), torch.ones(4, 6, dtype=F64), ValueError,
     r"weight must have shape \(\*, 5\)"),
])
def test_matrices_are_checked_by_every_entry_point(x, weight, error, match):
    with pytest.raises(error, match=match):
        A.normalized_layer("layer", x, weight, torch.ones(4, dtype=F64),
                           torch.zeros(4, dtype=F64))
    with pytest.raises(error, match=match):
        A.transform("dataset_rescaling", x, weight)


# ---------------------------------------------------------------- section 5.2: geometry


@pytest.mark.parametrize("family", ["softmax", "bernoulli"])
def test_fisher_of_plain_glm_equals_eq12(family):
    x, theta = _glm(0, gains=False)
    f = A.fisher_information(theta, x, "none", family)
    torch.testing.assert_close(f, A.glm_fisher_closed_form(theta, x, family), rtol=1e-10,
                               atol=1e-12)
    assert torch.allclose(f, f.T)
    assert torch.linalg.eigvalsh(f).min() > -1e-12


def test_fisher_bernoulli_single_unit_by_hand():
    # one logistic GLM: F = mean p(1-p) [x;1][x;1]^T
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.3, -0.2]], dtype=F64)
    theta = torch.tensor([[0.4, -0.7, 0.1]], dtype=F64)
    p = torch.sigmoid(x @ theta[0, :2] + theta[0, 2])
    xt = torch.cat([x, torch.ones(3, 1, dtype=F64)], 1)
    expected = sum(pi * (1 - pi) * torch.outer(r, r) for pi, r in zip(p, xt, strict=True)) / 3
    torch.testing.assert_close(A.fisher_information(theta, x, "none", "bernoulli"), expected)


@pytest.mark.parametrize("method", ["none", "batch", "weight", "layer"])
def test_metric_is_second_order_kl_eq8(method):
    x, theta = _glm(1, gains=method != "none")
    f = A.fisher_information(theta, x, method)
    delta = torch.randn(theta.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    for eps in (1e-3, 1e-4):
        kl = A.glm_kl_divergence(theta, eps * delta, x, method)
        ds2 = A.metric(f, eps * delta)
        assert ds2 > 0
        assert abs(kl - ds2) / ds2 < 20 * eps  # error is third order: relative error O(eps)


@pytest.mark.parametrize("method", ["batch", "weight", "layer"])
def test_fisher_is_flat_along_invariance_directions(method):
    x, theta = _glm(2)
    f = A.fisher_information(theta, x, method)
    d = x.shape[1]
    direction = torch.zeros_like(theta)
    if method == "layer":
        direction[:, :d] = theta[:, :d]  # scaling the whole matrix
    else:
        direction[0, :d] = theta[0, :d]  # scaling one row
    assert A.metric(f, direction) < 1e-12 * A.metric(f, torch.ones_like(theta))
    if method == "layer":  # re-centering: W + 1 gamma^T
        direction = torch.zeros_like(theta)
        direction[:, :d] = torch.randn(d, dtype=F64)
        assert A.metric(f, direction) < 1e-12


@pytest.mark.parametrize("method", ["batch", "weight", "layer"])
@pytest.mark.parametrize("seed", [0, 1])
def test_doubling_weights_quarters_curvature(method, seed):
    x, theta = _glm(seed)
    r = A.weight_scaling_curvature(theta, x, method, factor=2.0, seed=seed)
    assert r["output_change"] < 1e-8
    assert r["ratio"] == pytest.approx(0.25, rel=1e-6)
    assert r["grad_ratio"] == pytest.approx(0.5, rel=1e-6)
    r3 = A.weight_scaling_curvature(theta, x, method, factor=3.0, seed=seed)
    assert r3["ratio"] == pytest.approx(1 / 9, rel=1e-6)


@pytest.mark.parametrize("family", ["bernoulli", "softmax"])
@pytest.mark.parametrize("method", ["batch", "layer"])
@pytest.mark.parametrize("factor", [2.0, 0.5, 3.0])
def test_output_change_is_what_eps_allows(method, factor, family):
    """A unit (batch) or a case (layer) with a variance near 1e-6, so that eps / var ~ 1e-6:
    scaling W moves the log-probabilities by at most eps_bound, and by a good part of it."""
    x, theta = _glm(0)
    if method == "layer":
        x[0] *= 1e-3  # case 0's summed inputs, and their variance over the units, shrink
    else:
        theta[0, :x.shape[1]] *= 1e-3  # unit 0's summed inputs barely vary over the cases
    r = A.weight_scaling_curvature(theta, x, method, factor=factor, family=family)
    assert r["eps_bound"] > 1e-8  # eps matters here
    assert r["output_change"] <= r["eps_bound"] + 1e-15
    assert r["output_change"] >= r["eps_bound"] / 10
    w = A.weight_scaling_curvature(theta, x, "weight", factor=factor, family=family)
    assert w["eps_bound"] == 0.0 and w["output_change"] <= (factor == 3.0) * 1e-14


@pytest.mark.parametrize("method", ["batch", "weight", "layer"])
def test_gain_block_equals_eq13_and_eqs33_34(method):
    x, theta = _glm(3)
    f = A.fisher_information(theta, x, method)
    h, k = theta.shape
    idx = [i * k + k - 1 for i in range(h)]  # gain entries in vec([W, b, g]^T)
    cov = A.glm_output_covariance(theta, x, method)  # (N, H, H)
    z = A.glm_normalized_inputs(theta, x, method)  # (N, H)
    closed = (cov * z[:, :, None] * z[:, None, :]).mean(0)
    torch.testing.assert_close(f[idx][:, idx], closed, rtol=1e-9, atol=1e-12)
    for i in range(h):
        delta_g = torch.zeros(h, dtype=F64)
        delta_g[i] = 1.0
        assert A.metric(f, A.gain_direction(theta, delta_g)) == pytest.approx(
            0.5 * float(closed[i, i]), rel=1e-9)


def test_gain_metric_input_scaling_normalized_vs_plain_eq35():
    x, theta = _glm(4)
    d, c = x.shape[1], 3.0
    delta_g = torch.tensor([1.0, -0.5, 0.25], dtype=F64)
    for method in ("batch", "layer"):
        before = A.metric(A.fisher_information(theta, x, method), A.gain_direction(theta, delta_g))
        after = A.metric(A.fisher_information(theta, c * x, method),
                         A.gain_direction(theta, delta_g))
        assert after == pytest.approx(before, rel=1e-8)
    plain = theta[:, : d + 1].clone()
    scaled = plain.clone()
    scaled[:, :d] /= c  # same function on c * x
    before = A.metric(A.fisher_information(plain, x, "none"),
                      A.weight_magnitude_direction(plain, delta_g))
    after = A.metric(A.fisher_information(scaled, c * x, "none"),
                     A.weight_magnitude_direction(scaled, delta_g))
    assert after / before == pytest.approx(c * c, rel=1e-8)
    # eq. 35 closed form
    cov = A.glm_output_covariance(plain, x, "none")
    a = x @ plain[:, :d].T
    wn = plain[:, :d].norm(dim=1)
    eq35 = 0.5 * torch.einsum("i,j,nij,ni,nj->n", delta_g, delta_g, cov, a / wn, a / wn).mean()
    assert before == pytest.approx(float(eq35), rel=1e-9)


@pytest.mark.parametrize("method", ["batch", "layer"])
def test_gain_metric_is_exactly_scale_free_once_eps_scales_with_the_inputs(method):
    x, theta = _glm(4)
    d, c = x.shape[1], 0.1
    if method == "batch":  # close cases: a small spread for batch norm's statistics
        x = 0.5 + 1e-3 * x
    else:  # alike units: a small spread for layer norm's
        theta[:, :d] = theta[0, :d] + 1e-2 * theta[:, :d]
    delta_g = torch.tensor([1.0, -0.5, 0.25], dtype=F64)
    direction = A.gain_direction(theta, delta_g)
    before = A.metric(A.fisher_information(theta, x, method), direction)
    same_eps = A.metric(A.fisher_information(theta, c * x, method), direction)
    scaled_eps = A.metric(A.fisher_information(theta, c * x, method, eps=A.EPS * c**2),
                          direction)
    assert abs(scaled_eps / before - 1) < 1e-10  # LN(c a; eps c^2) = LN(a; eps), exactly
    assert abs(same_eps / before - 1) > 1e-8  # with the same eps, eps / (c^2 var) shows


def test_direction_change_demo_slower_turn_for_larger_norm():
    r = A.direction_change_demo(scales=(1.0, 4.0), method="layer", steps=15, n=64, seed=0)
    assert r.losses[0][0] == pytest.approx(r.losses[1][0], rel=1e-9)  # same function at t = 0
    assert r.angles[1][-1] < r.angles[0][-1] / 4
    for norms in r.norms:  # gradient is orthogonal to W: the norm can only grow under SGD
        assert all(b >= a - 1e-12 for a, b in zip(norms, norms[1:], strict=False))
    assert all(math.isfinite(v) for v in r.angles[0])


# ----------------------------------------------------------------------------- recurrent dynamics


def test_recurrent_dynamics_shapes_and_vanishing_gradient_of_a_plain_cell():
    torch.manual_seed(0)
    x = torch.randn(50, 8, 5)
    plain = lnbook.LNRNNCell(5, 32, layer_norm=False)
    with torch.no_grad():
        plain.weight_hh.mul_(0.1)
    d = A.recurrent_dynamics(plain, x)
    assert d.summed_input_rms.shape == d.grad_norm.shape == d.hidden_rms.shape == (50,)
    assert d.summed_input_rms.dtype == torch.float64
    # the gradient of sum(h_T) with respect to h_T is a vector of ones: norm sqrt(H)
    assert abs(d.grad_norm[-1].item() - 32**0.5) <= 1e-5
    assert d.grad_norm[0] < 1e-3 * d.grad_norm[-1]  # tiny recurrent weights: vanishing
    with pytest.raises(TypeError):
        A.recurrent_dynamics(torch.nn.RNNCell(5, 32), x)  # type: ignore[arg-type]
