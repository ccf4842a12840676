"""The outliers experiment (P24-P26) and the attention options it trains."""

import math

import numpy as np
import pytest
import torch

from lnbook.engine import History, Results, Run
from lnbook.experiments import outliers as o
from lnbook.transformer import SelfAttention, Transformer, TransformerConfig


def _reference(att: SelfAttention, x: torch.Tensor, sink: bool = False,
               clip: tuple[float, float] | None = None) -> torch.Tensor:
    """Attention written out in float64 from the module's weights."""
    p = {k: v.detach().double() for k, v in att.state_dict().items()}
    x = x.double()
    b, t, d = x.shape
    h, dh = att.n_heads, att.d_head

    def lin(name: str, z: torch.Tensor) -> torch.Tensor:
        return z @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    q, k, v = (lin(n, x).view(b, t, h, dh).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj"))
    s = q @ k.transpose(-2, -1) / math.sqrt(dh)
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    if sink:
        s = torch.cat([s, (q * p["sink_k"][:, None]).sum(-1, keepdim=True) / math.sqrt(dh)], -1)
        v = torch.cat([v, p["sink_v"][:, None].expand(b, h, 1, dh)], -2)
    w = torch.softmax(s, -1)
    if clip is not None:
        w = ((clip[1] - clip[0]) * w + clip[0]).clamp(0, 1)
    y = w @ v
    if "gate_proj.weight" in p:
        y = y * torch.sigmoid(lin("gate_proj", x)).transpose(1, 2)[..., None]
    return lin("out_proj", y.transpose(1, 2).reshape(b, t, d))


@pytest.mark.parametrize("opts", [{"sink": True}, {"clip": (-0.1, 1.05)}, {"gate": True}])
def test_attention_options_match_a_float64_reference(opts):
    torch.manual_seed(0)
    att = SelfAttention(8, 2, **opts)
    with torch.no_grad():
        for prm in att.parameters():
            prm.normal_(0, 0.5)  # sink key and value away from their zero start
    x = torch.randn(3, 5, 8)
    ref = _reference(att, x, sink=opts.get("sink", False), clip=opts.get("clip"))
    torch.testing.assert_close(att(x).double(), ref, atol=1e-5, rtol=1e-5)


def test_clipped_softmax_gives_exact_zeros_and_the_plain_one_at_gamma_0_zeta_1():
    torch.manual_seed(1)
    att = SelfAttention(8, 2, clip=(-0.2, 1.0))
    x = torch.randn(2, 6, 8)
    w = att.weights(x)
    assert (w[..., 1:, :] == 0).any()  # small weights clipped to exactly 0
    plain = SelfAttention(8, 2, clip=(0.0, 1.0))
    plain.load_state_dict(att.state_dict())
    torch.testing.assert_close(plain.weights(x), plain.logits(x).softmax(-1))


def test_a_zero_sink_is_one_more_logit_of_zero():
    torch.manual_seed(2)
    att = SelfAttention(8, 2, sink=True)
    x = torch.randn(2, 4, 8)
    w = att.weights(x)
    assert w.shape == (2, 2, 4, 5)
    logits = torch.cat([att.logits(x), torch.zeros(2, 2, 4, 1)], -1)
    torch.testing.assert_close(w, logits.softmax(-1))
    first = float(att.logits(x)[0, 0, 0, 0].detach())  # the first query sees one token and the sink
    assert float(w[0, 0, 0, -1].detach()) == pytest.approx(1 / (1 + math.exp(first)), abs=1e-6)


def test_config_fields_reach_the_attention_and_bad_clips_raise():
    cfg = TransformerConfig(5, 8, 2, 2, 6, attn_sink=True, attn_gate=True, attn_clip=[-0.1, 1])
    model = Transformer(cfg)
    a = model.blocks[0].attn
    assert a.sink and a.gate and a.clip == (-0.1, 1.0)
    assert model(torch.zeros(2, 6, dtype=torch.long)).shape == (2, 6, 5)
    for bad in [(0.1, 1.0), (-0.1, 0.9), (-0.1,), "x"]:
        with pytest.raises(ValueError, match="gamma <= 0 and zeta >= 1"):
            TransformerConfig(5, 8, 2, 2, 6, attn_clip=bad)
    plain = Transformer(TransformerConfig(5, 8, 2, 2, 6))
    assert not hasattr(plain.blocks[0].attn, "sink_k")


def test_presets_and_bad_config():
    q, p = o.get_config(), o.get_config("paper")
    assert q.variants == o.VARIANTS and q.seeds == 5 and p.steps > q.steps
    assert p.d_model > q.d_model
    with pytest.raises(ValueError, match="n_zero"):
        o.get_config(n_zero=0)
    with pytest.raises(ValueError, match="variants"):
        o.get_config(variants=("plain", "bogus"))
    with pytest.raises(ValueError, match="bits"):
        o.get_config(bits=1)


def test_fake_quant_and_top_ratio_by_hand():
    x = torch.tensor([0.0, 0.5, -1.27, 0.013])
    # scale 1.27 / 127 = 0.01: 0.5 -> 50, 0.013 -> 1 (rounded)
    torch.testing.assert_close(o.fake_quant(x), torch.tensor([0.0, 0.5, -1.27, 0.01]))
    assert torch.equal(o.fake_quant(torch.zeros(3)), torch.zeros(3))
    assert float(o.top_ratio(torch.tensor([1.0, -2.0, 3.0, 100.0, -4.0]))) == pytest.approx(
        100 / 3)


def test_gain_zeroing_and_outlier_dims():
    torch.manual_seed(3)
    cfg = o.get_config()
    model = o.build(cfg, "plain", 12)
    with torch.no_grad():
        model.blocks[1].norm2.weight[5] = 20.0
        model.final_norm.weight[9] = -15.0
    assert o.outlier_dims(model, 2) == [5, 9]
    x = torch.randint(0, 9, (4, 12))
    y = torch.randint(0, 9, (4, 12))
    before = [n.weight.clone() for n in o._norms(model)]
    loss = o.zeroed_gain_loss(model, [5, 9], x, y)
    assert all(torch.equal(a, n.weight) for a, n in zip(before, o._norms(model),
                                                            strict=True))
    with torch.no_grad():
        for n in o._norms(model):
            n.weight[[5, 9]] = 0
            n.bias[[5, 9]] = 0
        assert loss == pytest.approx(float(o._loss(model, x, y)))
    assert o.quantized_loss(model, x, y, bits=16) == pytest.approx(float(o._loss(model, x, y)),
                                                                   rel=1e-3)


def test_tiny_run_measures_every_copy():
    cfg = o.get_config(seeds=(0, 1), steps=3, eval_every=3, n_train=64, n_eval=16,
                       variants=("plain", "sink"), n_random=2)
    r = o.run(cfg, device="cpu")
    assert r.variants == ["plain", "sink"] and len(r.runs) == 4
    for run in r.runs:
        assert len(run.info["ratio"]) == cfg.n_layers
        assert run.info["ratio"][-1] == pytest.approx(run.history.metric("ratio_2")[-1],
                                                      rel=1e-4)
        assert run.info["loss"] == pytest.approx(run.history.metric("test_loss")[-1], rel=1e-4)


def _results(plain_ratio, sink_ratio):
    cfg = o.get_config(variants=("plain", "sink", "clipped", "gated"))
    runs = []
    for v, ratio in (("plain", plain_ratio), ("sink", sink_ratio), ("clipped", sink_ratio),
                     ("gated", sink_ratio)):
        for s, r in enumerate(ratio):
            h = History(eval_steps=[10], metrics=[{"test_loss": 0.1}])
            info = {"ratio": [1.0, r], "dim_share": 0.9, "loss": 0.1, "loss_int8": 0.3,
                    "loss_zero_outlier": 1.1, "loss_zero_random": 0.35}
            if v == "gated":
                info["loss_int8"] = 0.15
            runs.append(Run(v, s, h, info))
    return Results("outliers", vars(cfg), "cpu", runs, {"baseline_loss": 2.0})


def test_claim_values_on_known_results():
    r = _results([500.0, 50.0], [5.0, 5.0])
    v, ok = o.claim_values(r, "P24")
    np.testing.assert_allclose(v["a bias removes them"], [100.0, 10.0])
    assert ok["a bias removes them"].tolist() == [True, False]  # seed 2 is not massive
    v, ok = o.claim_values(r, "P25")
    np.testing.assert_allclose(v["keeps the loss"], [0.0, 0.0])
    np.testing.assert_allclose(v["eight-bit works"], [0.75, 0.75])
    v, _ = o.claim_values(r, "P26")
    np.testing.assert_allclose(v["far more than random"], [4.0, 4.0])
    with pytest.raises(ValueError, match="P24"):
        o.claim_values(r, "P99")
