"""Tests of lnbook.precision: every measurement against float64 or against exact arithmetic.

The expected values are derived by hand from the IEEE rounding rules (round to nearest, ties to
even) or bounded by the dtype's unit roundoff u, as each test says.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lnbook
from lnbook import precision as P

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def test_unit_roundoff_and_overflow_threshold_are_the_ieee_values():
    assert P.unit_roundoff(F16) == 2.0**-11
    assert P.unit_roundoff(BF16) == 2.0**-8
    assert P.unit_roundoff(F32) == 2.0**-24
    assert P.overflow_threshold(F16) == 65520.0  # 65504 + half of the top binade's 32
    # the threshold is where torch's rounding really turns to inf
    assert torch.isfinite(torch.tensor(65519.99, dtype=torch.float64).half())
    assert torch.isinf(torch.tensor(65520.0, dtype=torch.float64).half())
    big = torch.tensor(P.overflow_threshold(BF16), dtype=torch.float64)
    assert torch.isinf(big.bfloat16())
    assert torch.isfinite((big * (1 - 2.0**-20)).bfloat16())  # a few float32 ulps below


def test_half_ulps_scores_a_correct_rounding_at_most_one():
    ref = torch.linspace(-5, 5, 10001, dtype=torch.float64)
    h = P.half_ulps(ref.to(BF16), ref, BF16)
    assert h.max().item() <= 1.0 and h.max().item() > 0.9
    # one ulp away scores 2 (at |ref| >= 1), and below the floor the unit is u
    one = torch.tensor([1.0], dtype=torch.float64)
    assert P.half_ulps(one + 2.0**-7, one, BF16).item() == 2.0
    assert P.half_ulps(torch.tensor([2.0**-8]), torch.tensor([0.0]), BF16).item() == 1.0


def test_sum_of_squares_overflows_float16_exactly_where_the_rounding_rules_say():
    dims = [1, 256, 1024, 4094, 4096, 16384, 65536]
    mags = [0.5, 1.0, 1.0009765625, 2.0, 3.9990234375, 4.0, 15.9921875, 16.0, 255.875, 256.0]
    measured = P.overflow_grid(dims, mags)
    assert torch.equal(measured, P.predicted_overflow(dims, mags))
    row = {d: dict(zip(mags, measured[i].tolist(), strict=True)) for i, d in enumerate(dims)}
    assert row[4094][4.0] is False  # 4094 * 16 = 65504, the largest float16: finite
    assert row[4096][4.0] is True  # 65536: inf
    assert row[1][255.875] is False and row[1][256.0] is True  # one square overflows
    assert row[65536][1.0] is True and row[65536][0.5] is False  # unit values, 65536 wide
    assert P.largest_safe_magnitude(4094) == 4.0
    # the mean of squares does not overflow where the sum does (torch accumulates in float32)
    x = torch.full((4096,), 4.0, dtype=F16)
    assert (x * x).mean().item() == 16.0


def test_one_pass_variance_cancels_to_zero_on_a_hand_checked_row():
    # rows of 101 and 99 in float16: squares 10201 -> 10200 and 9801 -> 9800 (spacing 8),
    # their mean 10000, the mean's square 10000: E[x^2] - E[x]^2 = 0, the true variance is 1
    x = torch.tensor([[101.0, 99.0] * 8])
    assert P.variance(x, F16, "one-pass").item() == 0.0
    assert P.variance(x, F16, "two-pass").item() == 1.0
    assert P.variance(x, torch.float64, "one-pass").item() == 1.0


@pytest.mark.parametrize("dtype,means", [
    (F16, [0.0, 10.0, 100.0, 200.0]),
    (BF16, [0.0, 16.0, 64.0, 1000.0]),
    (F32, [0.0, 1e3, 1e4, 1e5]),
])
def test_two_pass_variance_stays_within_its_bound(dtype, means):
    u = P.unit_roundoff(dtype)
    for m in means:
        err = P.variance_error(m, dtype, "two-pass")
        assert err <= P.two_pass_bound(m, dtype)
        assert err <= 10 * u + (3 * u * m) ** 2  # measured: a mean within three roundings


@pytest.mark.parametrize("dtype,mean", [(F16, 100.0), (BF16, 64.0), (F32, 1e4)])
def test_one_pass_variance_is_lost_once_u_times_ratio_squared_passes_one(dtype, mean):
    u = P.unit_roundoff(dtype)
    assert u * mean**2 >= 4  # mean / std past 2 / sqrt(u)
    assert P.variance_error(mean, dtype, "one-pass") > 1.0  # off by more than the variance
    assert P.variance_error(mean, dtype, "two-pass") < 0.05


def test_variance_refuses_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        P.variance(torch.ones(2, 3), F16, "three-pass")
    with pytest.raises(TypeError, match="dtype"):
        P.variance(torch.ones(2, 3), torch.int32, "one-pass")
    with pytest.raises(TypeError):
        P.variance(torch.ones(2, 3, dtype=torch.int64), F16, "one-pass")


def test_gain_after_the_cast_rounds_twice_on_a_hand_checked_value():
    # v = 1 + 2^-8 + 2^-12 rounds to 1 + 2^-7 in bfloat16; times g = 1.5 that is 1.51171875,
    # a tie between 1.5078125 and 1.515625 that goes to the even 1.515625. Rounded once,
    # v * 1.5 = 1.50622... goes to 1.5078125.
    v = torch.tensor([1 + 2.0**-8 + 2.0**-12])
    g = torch.tensor([1.5], dtype=BF16)
    assert (v * g.float()).to(BF16).item() == 1.5078125
    assert (v.to(BF16) * g).item() == 1.515625


def test_gain_before_the_cast_is_correctly_rounded_and_after_is_not():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 512, generator=g).to(BF16)
    w = 1 + 0.5 * torch.randn(512, generator=g)
    for rms in (False, True):
        c = P.gain_cast_order(x, w, rms=rms)
        # one rounding of a float32 value: at most one half-ulp plus float32's error, which
        # is below 1e-3 of a bfloat16 half-ulp for these unit-scale rows
        assert c.max_half_ulps_before <= 1.001
        assert c.max_half_ulps_after > 1.5  # more than any single rounding can cost
        assert c.exact_before > 0.999 and c.exact_after < 0.9
        assert 0.1 < c.differ < 0.5
        assert c.after.dtype == c.before.dtype == BF16
    # torch's kernel and lnbook.layer_norm apply the gain before the cast: one rounding
    ref = P.gain_cast_order(x, w).reference
    for f in (torch.nn.functional.layer_norm, lnbook.layer_norm):
        assert P.half_ulps(f(x, (512,), w.to(BF16)), ref, BF16).max().item() <= 1.001
    same = P.gain_cast_order(x, torch.ones(512))  # a gain of 1 multiplies exactly
    assert same.differ == 0.0 and torch.equal(same.before, same.after)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        P.gain_cast_order(x.float(), w)


def test_running_sum_of_ones_stops_where_half_an_ulp_exceeds_one():
    ones = torch.ones(5000, 3)
    # bfloat16: 256 + 1 is a tie between 256 and 258, which goes to the even 256
    assert P.accumulate_rows(ones, BF16)[0].tolist() == [256.0] * 3
    assert P.accumulate_rows(ones, F16)[0].tolist() == [2048.0] * 3
    assert P.accumulate_rows(ones, F32)[0].tolist() == [5000.0] * 3
    # adding tens: past 2048 each step rounds up to the next multiple of 16 (2058 -> 2064),
    # until at 4096 half an ulp is 16 > 10 and the sum stops
    assert P.accumulate_rows(ones, BF16, chunk=10)[0].tolist() == [4096.0] * 3
    assert P.stagnation_bound(10.0, BF16) >= 4096.0
    sums = P.accumulate_rows(ones, F16, at=[100, 2048, 4000])
    assert sums[:, 0].tolist() == [100.0, 2048.0, 2048.0]
    assert 256.0 <= P.stagnation_bound(1.0, BF16)
    with pytest.raises(ValueError, match="chunk"):
        P.accumulate_rows(ones, BF16, chunk=3)
    with pytest.raises(ValueError, match="at"):
        P.accumulate_rows(ones, BF16, at=[6000])


def test_running_sum_matches_numpy_float16_arithmetic():
    terms = P.weight_grad_terms(3000, 8, F16)
    expected = np.zeros(8, dtype=np.float16)
    for row in terms.numpy():
        expected = (expected.astype(np.float32) + row).astype(np.float16)
    assert torch.equal(P.accumulate_rows(terms, F16)[0], torch.from_numpy(expected))


def test_weight_gradient_in_low_precision_against_float32_accumulation():
    at = [100, 1000, 10000]
    terms = P.weight_grad_terms(at[-1], 32, BF16)
    assert (terms >= 0).all()
    ref = terms.double().sum(0)
    assert math.isclose(ref.sum().item(), at[-1] * 32, rel_tol=1e-2)  # rows of x_hat^2
    err_bf16 = P.weight_grad_error(terms, BF16, at=at)
    err_f32 = P.weight_grad_error(terms, F32, at=at)
    for n, e in zip(at, err_f32, strict=True):
        assert e <= P.recursive_sum_bound(n, F32)
    # the bfloat16 sum cannot pass the stagnation bound, whatever the number of rows
    cap = P.stagnation_bound(terms.max().item(), BF16)
    assert err_bf16[-1] >= 1 - cap / ref.min().item() > 0.1
    assert err_bf16 == sorted(err_bf16)  # grows with the number of rows


def test_lnbook_accumulates_the_weight_gradient_in_float32():
    rows, dim = 20000, 32
    u = P.unit_roundoff(BF16)
    bound = u + P.recursive_sum_bound(rows + 2 * dim, F32)  # one final rounding
    assert P.kernel_weight_grad_error(rows, dim, BF16, "lnbook") <= bound
    assert P.kernel_weight_grad_error(rows, dim, F16, "lnbook") <= (
        P.unit_roundoff(F16) + P.recursive_sum_bound(rows + 2 * dim, F32))
    assert P.kernel_weight_grad_error(
        rows, dim, BF16, "lnbook", weight_dtype=F32) <= P.recursive_sum_bound(rows + 2 * dim, F32)


def test_torch_cpu_kernel_weight_gradient_stagnates_in_bfloat16():
    # measured on torch's CPU kernel (one thread): its dL/dg for bfloat16 inputs is a running
    # sum in bfloat16, so it obeys the stagnation bound (terms y * x_hat <= max x_hat^2 < dim)
    rows, dim = 100000, 32
    for wdt in (BF16, F32):
        err = P.kernel_weight_grad_error(rows, dim, BF16, "torch", weight_dtype=wdt)
        cap = P.stagnation_bound(float(dim), BF16)
        # the column sums are rows +- a few sqrt(2 rows): 0.9 rows is far below any of them
        assert err >= 1 - cap / (0.9 * rows) > 0.8


def test_autocast_report_measures_dtypes_and_where_statistics_are_computed():
    for dtype in (BF16, F16):
        rows = {r.name: r for r in P.autocast_report(dtype, dim=128, rows=16)}
        assert len(rows) == 7
        for name, r in rows.items():
            assert r.input_dtype == dtype
            assert r.grad_dtype == F32  # the parameters stay float32 under autocast
            if name == "eq. 3 in tensor ops":
                assert r.output_dtype == F32  # the float32 gain promotes
                assert r.max_half_ulps > 10  # statistics rounded to the low precision
            else:
                assert r.output_dtype == dtype  # CPU autocast leaves the norms' dtype alone
        assert rows["lnbook.layer_norm"].max_half_ulps <= 1.001
        assert rows["lnbook.rms_norm"].max_half_ulps <= 1.001
        assert rows["F.layer_norm"].max_half_ulps <= 2.0
