"""lnbook.conformance.check_norm: the family and the findings of the famous norms, each written
here as its authors wrote it, and of the mistakes of chapter 13."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lnbook
from lnbook.checks import ShapeError
from lnbook.conformance import FAMILIES, NormCheck, check_norm
from lnbook.experiments import mistakes

ANNOTATED = "the Annotated Transformer's LayerNorm (unbiased std, eps outside the root)"


class AnnotatedLayerNorm(nn.Module):
    """The Annotated Transformer's layer norm (Rush, 2018), as written there."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class LlamaRMSNorm(nn.Module):
    """LLaMA's RMSNorm: the statistics of ``x.float()``, the gain after the cast back."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class HalfRMSNorm(LlamaRMSNorm):
    """The same with the cast after the statistics: in float16 they are float16's."""

    def forward(self, x):
        return (self._norm(x).float() * self.weight).type_as(x)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the gain is 1 + w, with w starting at 0."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class LayerNorm2d(nn.Module):
    """ConvNeXt's channels-first layer norm: statistics over dimension 1 of (N, C, H, W)."""

    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


def _breaks(check: NormCheck) -> set[str]:
    assert check.breaks == tuple(f.name for f in check.findings if f.verdict == "BREAKS")
    return set(check.breaks)


def test_torch_layer_norm_is_the_reference():
    c = check_norm(nn.LayerNorm(16), shape=(4, 16))
    assert c.family == "torch.nn.LayerNorm" and c.ok and _breaks(c) == set()
    assert c["variance"].evidence["scale"] == pytest.approx(1.0, abs=1e-9)
    assert c["eps"].evidence["eps"] == pytest.approx(1e-5, rel=1e-6)
    assert "inside the root" in c["eps"].follows and "torch's default" in c["eps"].follows
    assert c["gain"].evidence["applied_at_start"] == 1.0 and c["bias"].evidence["start"] == 0
    assert c["float16"].evidence["half_ulps"] <= 1.0  # one rounding of the output
    assert c["float16"].evidence["float16_statistics"] > 100  # what float16 would give
    assert c["gradient"].evidence["gradcheck"] == 1.0
    assert c["gradient"].evidence["vs_reference"] < 1e-12


def test_annotated_transformer_layer_norm_breaks_variance_and_eps():
    c = check_norm(AnnotatedLayerNorm(16), shape=(4, 16))
    assert c.family == ANNOTATED and c.nearest == ANNOTATED and c.differs == ()
    assert {"variance", "eps"} <= _breaks(c)
    assert c["variance"].evidence["scale"] == pytest.approx(math.sqrt(15 / 16), rel=1e-9)
    assert "unbiased" in c["variance"].follows
    assert c["eps"].evidence["eps"] == pytest.approx(1e-6, rel=1e-3)
    assert "outside the root" in c["eps"].follows
    # eps inside the root does not fit: its estimates spread over orders of magnitude
    assert c["eps"].evidence["spread_inside"] > 10 * c["eps"].evidence["spread_outside"]
    assert c["gain"].ok and "a_2" in c["gain"].follows and "b_2" in c["bias"].follows
    assert c["gradient"].ok  # the gradient of its own (mistaken) form
    assert not c.ok


def test_half_precision_rms_norm_is_flagged_for_its_cast_order():
    c = check_norm(HalfRMSNorm(16), shape=(4, 16))
    assert c.family == "T5/LLaMA RMSNorm"
    assert _breaks(c) == {"float16", "bfloat16"}
    f16 = c["float16"]
    assert "statistics in float16" in f16.follows and "too late" in f16.follows
    assert f16.evidence["half_ulps"] > 100  # x^2 overflows float16 at |x| >= 256
    assert f16.evidence["half_ulps"] == pytest.approx(f16.evidence["float16_statistics"])
    assert c["bfloat16"].evidence["half_ulps"] > 1.0
    # the cast before the statistics (LLaMA's order) passes both
    good = check_norm(LlamaRMSNorm(16), shape=(4, 16))
    assert good.family == "T5/LLaMA RMSNorm" and good.ok
    assert good["float16"].evidence["half_ulps"] <= 1.0
    assert good["centring"].ok is None and good["bias"].ok  # RMSNorm: no mean, no bias


def test_gemma_rms_norm_gain_is_one_plus_w():
    m = GemmaRMSNorm(16)
    c = check_norm(m, shape=(4, 16))
    assert c.family == "Gemma RMSNorm" and c.ok
    assert c["gain"].ok is None and "1 + weight" in c["gain"].follows
    assert c["gain"].evidence["applied_at_start"] == 1.0
    assert torch.equal(m.weight, torch.zeros(16))  # the reader's module is left alone
    # LLaMA's RMSNorm is the nearest family of a Gemma-form module, and vice versa
    assert check_norm(LlamaRMSNorm(16), (4, 16)).family == "T5/LLaMA RMSNorm"


def test_group_norm_one_group_and_channels_first_layer_norm():
    c = check_norm(nn.GroupNorm(1, 8), shape=(2, 8, 4, 4), dims=(1, 2, 3))
    assert c.family == "GroupNorm(1, C)" and c.ok
    assert c["axes"].evidence["dims"] == 3 and "one per channel" in c["gain"].follows
    c2 = check_norm(LayerNorm2d(8), shape=(2, 8, 4, 4), dims=1)
    assert c2.family == "LayerNorm2d" and c2["axes"].ok
    assert c2["eps"].evidence["eps"] == pytest.approx(1e-6, rel=1e-3)
    assert _breaks(c2) == {"float16", "bfloat16"}  # ConvNeXt's computes in the input dtype
    c3 = check_norm(lnbook.ChannelLayerNorm(8), shape=(2, 8, 4, 4), dims=1)
    assert c3.family == "LayerNorm2d" and c3.ok
    # LayerNorm over (C, H, W) normalizes the same values but has a gain per value
    c4 = check_norm(nn.LayerNorm((8, 4, 4)), (2, 8, 4, 4), normalized_shape=(8, 4, 4))
    assert c4.family == "torch.nn.LayerNorm" and c4.ok


def test_lnbook_norms():
    c = check_norm(lnbook.LayerNorm(16), shape=(4, 16))
    assert c.family == "torch.nn.LayerNorm" and c.ok
    r = check_norm(lnbook.RMSNorm(16), shape=(4, 16))
    assert r.family == "T5/LLaMA RMSNorm" and r.ok
    # eps=None: the machine epsilon of the computation, float64 here
    assert r["eps"].evidence["eps"] == pytest.approx(torch.finfo(torch.float64).eps, rel=0.01)
    assert check_norm(nn.RMSNorm(16, eps=1e-6), (4, 16)).family == "T5/LLaMA RMSNorm"


@pytest.mark.parametrize("eps", [1e-2, 1e-4, 1e-8, 1e-12])
@pytest.mark.parametrize("inside", [True, False])
def test_eps_value_and_place_are_measured(eps, inside):
    def norm(x):
        return mistakes.layer_norm_variant(x, eps, eps_inside=inside)

    c = check_norm(norm, (3, 32))
    assert c["eps"].evidence["eps"] == pytest.approx(eps, rel=1e-3)
    assert c["eps"].ok is inside


def test_the_mistakes_of_chapter_13_are_flagged():
    one = check_norm(lambda x: mistakes.layer_norm_variant(x, one_pass=True), (4, 16))
    assert _breaks(one) == {"large mean"}
    assert one["large mean"].evidence["worst_module"] > 1e3
    assert one["large mean"].evidence["worst_two_pass"] < 1
    det = check_norm(mistakes.DetachNorm(16), (4, 16))
    assert "gradient" in _breaks(det) and det["gradient"].evidence["gradcheck"] == 0.0
    assert det["gradient"].evidence["vs_reference"] > 0.1
    zero = check_norm(lambda x: F.layer_norm(x, (16,), eps=0.0), (4, 16))
    assert {"eps", "constant"} <= _breaks(zero)
    assert zero["constant"].evidence["output_finite"] == 0.0
    bare = check_norm(nn.LayerNorm(16, elementwise_affine=False), (4, 16))
    assert bare.family == "none of the known families"
    assert bare.nearest == "torch.nn.LayerNorm" and bare.differs == ("gain", "bias")
    assert {"gain", "bias"} <= _breaks(bare)
    bias = check_norm(nn.LayerNorm(16, bias=False), (4, 16))
    assert bias.differs == ("bias",) and _breaks(bias) == {"bias"}


def test_axes_that_are_not_a_layer_norm():
    bn = check_norm(nn.BatchNorm1d(16), (4, 16))  # training mode: across the batch
    assert bn["axes"].ok is False and "across the batch" in bn["axes"].follows
    assert bn.family == "none of the known families" and "axes" in bn.differs
    dyt = check_norm(lnbook.DyT(16), (4, 16))
    assert dyt["axes"].ok is False and len(dyt.findings) == 1 and dyt.nearest is None
    gn = check_norm(nn.GroupNorm(2, 8), (2, 8, 4, 4), dims=(1, 2, 3))
    assert "in groups" in gn["axes"].follows and gn["axes"].ok is False


def test_report_fits_the_page():
    c = check_norm(AnnotatedLayerNorm(16), shape=(4, 16))
    text = str(c)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 88 and len(lines) < 40
    assert lines[1] == f"family: {ANNOTATED}"[:len(lines[1])]
    assert "breaks: variance, eps" in text
    md = c._repr_markdown_()
    assert md.count("\n| ") == len(c.findings) + 1  # a header and a row per finding
    assert "BREAKS" in md and "AnnotatedLayerNorm" in repr(c)
    with pytest.raises(KeyError, match="the findings are"):
        c["nonsense"]
    assert set(FAMILIES) >= {ANNOTATED, "Gemma RMSNorm", "LayerNorm2d"}


def test_a_float32_only_layer_is_probed_in_float32():
    c = check_norm(lambda x: F.layer_norm(x.float(), (16,)), (4, 16))
    assert c.dtype == torch.float32 and c.family == "torch.nn.LayerNorm"
    assert "gradcheck" not in c["gradient"].evidence and c["gradient"].ok


def test_a_layer_without_autograd_or_half_precision():
    det = check_norm(lambda x: F.layer_norm(x, (16,)).detach(), (4, 16))
    assert set(det.breaks) == {"constant", "gradient"}
    assert "no gradient" in det["gradient"].follows

    def no_half(x):
        if x.dtype in (torch.float16, torch.bfloat16):
            raise NotImplementedError("float32 and float64 only")
        return F.layer_norm(x, (16,))

    c = check_norm(no_half, (4, 16))
    assert c.family == "torch.nn.LayerNorm" and c.ok
    assert c["float16"].ok is None and "float32 and float64 only" in c["float16"].follows


def test_bad_arguments():
    with pytest.raises(TypeError, match="torch.nn.Module or a function"):
        check_norm(3, (4, 16))
    with pytest.raises(TypeError, match="sequence of positive ints"):
        check_norm(nn.LayerNorm(16), 16)
    with pytest.raises(ValueError, match="positive int"):
        check_norm(nn.LayerNorm(16), (0, 16))
    with pytest.raises(ValueError, match="dims or normalized_shape"):
        check_norm(nn.LayerNorm(16), (4, 16), dims=1, normalized_shape=16)
    with pytest.raises(ShapeError, match="trailing dimensions"):
        check_norm(nn.LayerNorm(16), (4, 16), normalized_shape=8)
    with pytest.raises(ValueError, match="distinct axes"):
        check_norm(nn.LayerNorm(16), (4, 16), dims=(2,))
    with pytest.raises(ShapeError, match=r"raised RuntimeError on an input of shape \(4, 8\)"):
        check_norm(nn.LayerNorm(16), (4, 8))
    with pytest.raises(ShapeError, match="must return a tensor of its input's shape"):
        check_norm(lambda x: x.sum(-1), (4, 16))
