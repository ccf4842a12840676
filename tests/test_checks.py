"""lnbook.checks: one set of argument checks, with torch's exception types for torch's mistakes."""

import itertools

import numpy as np
import pytest
import torch

import lnbook
import lnbook.analysis
import lnbook.batched
import lnbook.data
import lnbook.experiments.draw
from lnbook import norms
from lnbook.checks import (
    DTypeError,
    ShapeError,
    as_normalized_shape,
    check_bool,
    check_choice,
    check_config,
    check_eps,
    check_floating,
    check_param_dtype,
    check_shape,
    check_size,
    check_subset,
)


def test_floating_names_what_was_expected():
    check_floating(torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="hx must be a torch.Tensor, got list"):
        check_floating([1.0], "hx")
    with pytest.raises(TypeError, match="hx must be a floating-point.*torch.int32"):
        check_floating(torch.ones(2, dtype=torch.int32), "hx")
    assert not hasattr(norms, "_check_floating")  # no alias kept for an old private name
    assert norms.check_floating is check_floating  # the public name in norms is the same one


def test_size_refuses_wrong_types_with_type_error_and_small_values_with_value_error():
    assert check_size("hidden_size", np.int64(4)) == 4
    assert check_size("proj_size", 0, minimum=0) == 0
    for bad in (2.0, True, "4", None):
        with pytest.raises(TypeError, match="hidden_size must be a positive int"):
            check_size("hidden_size", bad)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="hidden_size must be a positive int"):
            check_size("hidden_size", bad)
    with pytest.raises(ValueError, match="proj_size must be an int >= 0, got -1"):
        check_size("proj_size", -1, minimum=0)


def test_bool_refuses_ints_and_strings():
    assert check_bool("batch_first", False) is False
    for bad in (0, 1, "False", "True", None, np.bool_(True)):
        with pytest.raises(TypeError, match="batch_first must be a bool"):
            check_bool("batch_first", bad)


def test_shape_error_is_both_value_error_and_runtime_error():
    check_shape(torch.zeros(3, 4), (None, 4), "h0")
    with pytest.raises(ShapeError, match=r"h0 must have shape \(\*, 5\), got \(3, 4\)"):
        check_shape(torch.zeros(3, 4), (None, 5), "h0")
    with pytest.raises(RuntimeError, match=r"c0 must have shape \(4,\), got \(1, 4\)"):
        check_shape(torch.zeros(1, 4), (4,), "c0")
    with pytest.raises(ValueError):
        check_shape(torch.zeros(1, 4), (4,), "c0")


def test_eps_and_choice():
    assert check_eps(1e-5) == 1e-5
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="eps must be a finite number > 0"):
            check_eps(bad)
    for bad in (True, None, "1e-5"):
        with pytest.raises(TypeError, match="eps must be a finite number > 0"):
            check_eps(bad)
    assert check_eps(None, allow_none=True) is None
    assert check_choice("norm", "rms", ("layer", "rms")) == "rms"
    with pytest.raises(ValueError, match="norm must be one of 'layer', 'rms', got 'batch'"):
        check_choice("norm", "batch", ("layer", "rms"))


def test_config_names_the_class_and_how_to_make_one():
    from lnbook.experiments import dyt, mistakes, norm_ablation

    check_config(dyt.get_config("quick"), dyt.Config)  # the right class passes
    made = r"config must be a dyt\.Config \(make one with get_config\), got dict"
    with pytest.raises(TypeError, match=made):
        check_config({}, dyt.Config)
    with pytest.raises(TypeError, match=r"norm_ablation\.Config \(make one with get_config\)"):
        norm_ablation.run(mistakes.get_config("quick"))
    with pytest.raises(TypeError, match=r"^config must be a dyt\.Config, got int$"):
        check_config(3, dyt.Config, None)


def test_normalized_shape_refuses_a_string():
    assert as_normalized_shape(8) == (8,)
    assert as_normalized_shape([4, 8]) == (4, 8)
    assert as_normalized_shape(torch.Size([3])) == (3,)
    for bad in ("12", b"12", 2.0, [2.0], True, [True], None):
        with pytest.raises(TypeError, match="normalized_shape must be an int or a sequence"):
            as_normalized_shape(bad)
    for bad in ((), (0,), (4, -1)):
        with pytest.raises(ValueError, match="positive sizes"):
            as_normalized_shape(bad)


def test_layers_are_as_strict_as_torch():
    # torch.nn.LayerNorm('12') raises; so does lnbook's (it used to become (1, 2))
    with pytest.raises(TypeError):
        lnbook.LayerNorm("12")
    for kw in ({"elementwise_affine": 1}, {"bias": "False"}):
        with pytest.raises(TypeError, match="must be a bool"):
            lnbook.LayerNorm(4, **kw)
    with pytest.raises(TypeError, match="affine must be a bool"):
        lnbook.BatchNorm(4, affine=0)
    # a shape mismatch is a RuntimeError, as torch's F.layer_norm raises for it
    with pytest.raises(RuntimeError):
        torch.nn.functional.layer_norm(torch.ones(2, 3), (4,))
    with pytest.raises(RuntimeError, match="trailing dimensions"):
        lnbook.layer_norm(torch.ones(2, 3), 4)


def test_module_shape_errors_are_runtime_errors_as_torch_raises():
    # torch raises RuntimeError for each of these wrong shapes; lnbook's ShapeError is one too
    cases = [
        (torch.nn.LSTM(3, 4), lnbook.LSTM(3, 4), torch.zeros(5, 2, 7)),
        (torch.nn.GroupNorm(2, 4), lnbook.GroupNorm(2, 4), torch.zeros(2, 6, 3)),
        (torch.nn.Linear(3, 2), lnbook.WeightNormLinear(3, 2), torch.zeros(4, 5)),
    ]
    for theirs, ours, x in cases:
        with pytest.raises(RuntimeError):
            theirs(x)
        with pytest.raises(RuntimeError):
            ours(x)
        with pytest.raises(ValueError):  # and still the ValueError lnbook always raised
            ours(x)
    with pytest.raises(RuntimeError, match="h_0 must have shape"):
        lnbook.LSTM(3, 4)(torch.zeros(5, 2, 3), (torch.zeros(1, 3, 4), torch.zeros(1, 2, 4)))


@pytest.mark.parametrize("call", [
    lambda v: lnbook.data.copy_task(v, 5, 8, seed=0),
    lambda v: lnbook.batched.SeedMLP(v, (4, 3)),
    lambda v: lnbook.analysis.direction_change_demo(steps=v),
    lambda v: lnbook.experiments.draw.DRAW(28, 28, glimpses=v),
])
def test_sizes_go_through_check_size_wrong_type_or_value(call):
    with pytest.raises(TypeError, match="must be a positive int, got 2.5"):
        call(2.5)
    with pytest.raises(ValueError, match="must be a positive int, got 0"):
        call(0)


def test_subset_names_every_value_outside_the_choices():
    check_subset("norms", ("layer", "batch"), ("layer", "batch", "none"))
    check_subset("norms", (), ("layer",))  # nothing to refuse
    with pytest.raises(ValueError, match=r"norms must be drawn from \('layer', 'none'\), "
                                         r"got \['rms', 'group'\]"):
        check_subset("norms", ("rms", "layer", "group"), ("layer", "none"))
    from lnbook.experiments import mnist

    with pytest.raises(ValueError, match=r"norms must be drawn from .*got \['rms'\]"):
        mnist.get_config("quick", norms=("layer", "rms"))


def test_param_dtype_follows_torchs_rule_for_norms():
    """Parameters share one dtype, the input's or float32 for a half input: what F.layer_norm
    accepts; anything else raises what it raises (RuntimeError), as a DTypeError."""
    f16, f32, f64 = torch.float16, torch.float32, torch.float64
    assert issubclass(DTypeError, TypeError) and issubclass(DTypeError, ValueError) \
        and issubclass(DTypeError, RuntimeError)
    for x_dtype, w_dtype, b_dtype in itertools.product((f16, f32, f64), repeat=3):
        x, w, b = torch.randn(2, 4, dtype=x_dtype), torch.ones(4, dtype=w_dtype), \
            torch.zeros(4, dtype=b_dtype)
        try:
            torch.nn.functional.layer_norm(x, (4,), w, b)
        except RuntimeError:
            with pytest.raises(DTypeError):
                check_param_dtype(x, weight=w, bias=b)
        else:
            check_param_dtype(x, weight=w, bias=b)
    check_param_dtype(torch.ones(2, dtype=f64), weight=None, bias=None)
    with pytest.raises(DTypeError, match="must share one dtype, got weight torch.float32, "
                                         "bias torch.float16"):
        check_param_dtype(torch.ones(4, dtype=f16), weight=torch.ones(4), bias=torch.ones(
            4, dtype=f16))
