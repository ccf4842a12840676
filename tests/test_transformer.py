"""lnbook.transformer: shapes, masking, placements, norms, qk-norm, DeepNorm, P03, measurements."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lnbook import LayerNorm, layer_norm
from lnbook.transformer import (
    Block,
    SelfAttention,
    Transformer,
    TransformerConfig,
    center_residual_stream_,
    deepnorm_constants,
    layer_gradient_norms,
    make_norm,
    max_attention_logits,
    norm_inputs_outputs,
    residual_stream,
    sequence_loss,
    softmax,
    to_pre_rmsnorm,
)
from lnbook.variants import DyT, RMSNorm

V, D, H, L, T = 13, 32, 4, 2, 16


def tokens(seed: int = 0, batch: int = 4, length: int = T) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, length), generator=g)


def model(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    kw.setdefault("dtype", torch.float64)
    return Transformer(V, D, H, L, T, **kw)


def config(**kw) -> TransformerConfig:
    return TransformerConfig(V, D, H, L, T, **kw)


def perturb_(m: nn.Module, seed: int = 1, scale: float = 0.2) -> nn.Module:
    """Move every parameter off its initial value (norm gains and biases included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


@pytest.mark.parametrize("norm", ["layer", "rms", "dyt", "none"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_shapes_and_norm_modules(norm, position):
    m = model(norm=norm, position=position, qk_norm=True)
    idx = tokens(length=T - 3)
    logits = m(idx)
    assert logits.shape == (4, T - 3, V) and logits.dtype == torch.float64
    assert torch.isfinite(logits).all()
    kind = {"layer": LayerNorm, "rms": RMSNorm, "dyt": DyT, "none": nn.Identity}[norm]
    for block in m.blocks:
        assert type(block.norm1) is kind and type(block.norm2) is kind
        assert type(block.attn.q_norm) is LayerNorm  # qk-norm is a layer norm per head
        assert block.attn.q_norm.normalized_shape == (D // H,)
    assert type(m.final_norm) is (kind if position == "pre" else nn.Identity)
    assert m.config.has_final_norm() == (position == "pre")
    block = Block(config(norm=norm, position=position))
    assert isinstance(block(torch.randn(2, 5, D)), torch.Tensor)


def test_final_norm_can_be_forced_either_way():
    assert type(model(position="post", final_norm=True).final_norm) is LayerNorm
    assert type(model(position="pre", final_norm=False).final_norm) is nn.Identity


def test_causal_output_at_t_ignores_later_inputs():
    m = perturb_(model())
    idx = tokens()
    changed = idx.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % V  # change every token from position 9 on
    a, b = m(idx), m(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], atol=0, rtol=0)
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-3
    # without the mask, earlier positions do see the change (so the check above can fail)
    nc = perturb_(model(causal=False))
    assert (nc(idx)[:, :9] - nc(changed)[:, :9]).abs().max() > 1e-3


def test_attention_masks_with_minus_infinity_and_rows_sum_to_one():
    attn = SelfAttention(D, H, dtype=torch.float64)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    logits = attn.logits(x)  # (B, H, T, T)
    assert logits.shape == (2, H, 6, 6)
    above = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert torch.isneginf(logits[..., above]).all() and torch.isfinite(logits[..., ~above]).all()
    q = attn.q_proj(x).view(2, 6, H, D // H).transpose(1, 2)
    k = attn.k_proj(x).view(2, 6, H, D // H).transpose(1, 2)
    expected = q @ k.transpose(-2, -1) / math.sqrt(D // H)
    torch.testing.assert_close(logits[..., ~above], expected[..., ~above])
    # against torch's fused attention
    v = attn.v_proj(x).view(2, 6, H, D // H).transpose(1, 2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 6, D)
    torch.testing.assert_close(attn(x), attn.out_proj(ref))


def test_pre_and_post_placement_compute_different_functions():
    pre, post = model(position="pre"), model(position="post")
    post.load_state_dict(pre.state_dict(), strict=False)  # same weights (post has no final norm)
    idx = tokens()
    assert (pre(idx) - post(idx)).abs().max() > 1e-2
    # Post-LN: each block's output is a layer norm's output (gain 1, bias 0 at init)
    for x in residual_stream(post, idx)[1:]:
        torch.testing.assert_close(x.mean(-1), torch.zeros_like(x[..., 0]), atol=1e-12, rtol=0)
        torch.testing.assert_close(x.var(-1, unbiased=False), torch.ones_like(x[..., 0]),
                                   atol=1e-3, rtol=0)
    # Pre-LN: the stream is not normalized, it accumulates the branches
    last = residual_stream(pre, idx)[-1]
    assert (last.var(-1, unbiased=False) - 1).abs().max() > 0.1


def test_block_forward_is_the_documented_formula():
    torch.manual_seed(3)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    pre = perturb_(Block(config(), dtype=torch.float64))
    h = x + pre.attn(pre.norm1(x))
    torch.testing.assert_close(pre(x), h + pre.mlp(pre.norm2(h)))
    post = perturb_(Block(config(position="post", deepnorm=True), dtype=torch.float64))
    a = (2 * L) ** 0.25
    h = post.norm1(a * x + post.attn(x))
    torch.testing.assert_close(post(x), post.norm2(a * h + post.mlp(h)))


def test_qk_norm_bounds_the_logits_and_ignores_the_scale_of_the_projections():
    idx = tokens()
    for qk in (False, True):
        m = model(qk_norm=qk)
        m(idx)
        before = max_attention_logits(m)
        with torch.no_grad():
            for block in m.blocks:
                block.attn.q_proj.weight.mul_(10)
                block.attn.k_proj.weight.mul_(10)
                block.attn.q_proj.bias.normal_()
        m(idx)
        after = max_attention_logits(m)
        if qk:  # |q_hat . k_hat| / sqrt(d_h) <= sqrt(d_h) with unit gains
            assert all(v <= math.sqrt(D // H) for v in before + after)
            assert all(abs(a - b) < 0.5 for a, b in zip(after, before, strict=True))
        else:  # logits scale with the product of the two projections' scales
            assert all(a > 20 * b for a, b in zip(after, before, strict=True))


def test_max_attention_logits_reads_the_last_forward():
    m = perturb_(model())
    with pytest.raises(RuntimeError, match="has not run a forward"):
        max_attention_logits(m)
    idx = tokens()
    with torch.no_grad():
        m(idx)
        read = max_attention_logits(m)
        x = m.embed(idx)
        expected = []
        for block in m.blocks:
            expected.append(float(block.attention_logits(x).amax()))
            assert torch.equal(block.attention_logits(x), block.attn.logits(block.norm1(x)))
            x = block(x)
    assert read == pytest.approx(expected, abs=1e-12)
    post = perturb_(Block(config(position="post"), dtype=torch.float64))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    assert torch.equal(post.attention_logits(x), post.attn.logits(x))
    assert max_attention_logits(m.blocks[1]) == pytest.approx(expected[1:], abs=1e-12)


def test_layer_gradient_norms_equal_the_norms_of_backward():
    m = perturb_(model(position="post"))
    idx, targets = tokens(1), tokens(2)
    norms = layer_gradient_norms(m, idx, targets)
    assert all(p.grad is None for p in m.parameters())  # .grad left alone
    sequence_loss(m(idx), targets).backward()
    assert len(norms) == L
    for block, got in zip(m.blocks, norms, strict=True):
        for name, p in block.named_parameters():
            assert got[name] == pytest.approx(float(p.grad.norm()), rel=1e-10)
        ffn = math.sqrt(sum(float(p.grad.square().sum()) for p in block.mlp.parameters()))
        att = math.sqrt(sum(float(p.grad.square().sum()) for p in block.attn.parameters()))
        allp = math.sqrt(sum(float(p.grad.square().sum()) for p in block.parameters()))
        assert got["ffn"] == pytest.approx(ffn, rel=1e-10)
        assert got["attention"] == pytest.approx(att, rel=1e-10)
        assert got["block"] == pytest.approx(allp, rel=1e-10)
        assert got["norms"] > 0


def test_norm_inputs_outputs_records_every_norm():
    m = perturb_(model(qk_norm=True))
    io = norm_inputs_outputs(m, tokens())
    assert list(io)[:4] == ["blocks.0.norm1", "blocks.0.attn.q_norm", "blocks.0.attn.k_norm",
                            "blocks.0.norm2"]
    assert len(io) == 4 * L + 1 and list(io)[-1] == "final_norm"
    x, y = io["blocks.1.norm2"]
    ln = m.blocks[1].norm2
    torch.testing.assert_close(y, layer_norm(x, D, ln.weight, ln.bias))
    assert not any(mod._forward_hooks for mod in m.modules())  # the hooks are removed


def test_center_residual_stream_keeps_the_function_and_centres_the_stream():
    m = perturb_(model(qk_norm=True))
    idx = tokens()
    before = m(idx)
    assert residual_stream(m, idx)[0].mean(-1).abs().max() > 0.05
    center_residual_stream_(m)
    torch.testing.assert_close(m(idx), before, atol=1e-12, rtol=0)
    for x in residual_stream(m, idx):
        assert x.mean(-1).abs().max() < 1e-13


@pytest.mark.parametrize("qk_norm", [False, True])
def test_pre_ln_and_its_pre_rmsnorm_conversion_agree_to_float64_precision(qk_norm):
    m = perturb_(model(qk_norm=qk_norm))  # nonzero norm biases: they must be folded
    assert all(bool(b.norm1.bias.any()) for b in m.blocks)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    rms = to_pre_rmsnorm(m)
    assert rms.config.norm == "rms" and type(rms.blocks[0].norm1) is RMSNorm
    assert rms.blocks[0].norm1.eps == m.blocks[0].norm1.eps
    for seed in range(3):
        idx = tokens(seed)
        torch.testing.assert_close(rms(idx), m(idx), atol=1e-11, rtol=0)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in state.items())  # input untouched
    # swapping the norms without centring and folding does not give the same function
    naive = Transformer.from_config(rms.config, dtype=torch.float64)
    naive.load_state_dict({k: v for k, v in state.items() if not k.endswith("norm1.bias")
                           and not k.endswith("norm2.bias") and k != "final_norm.bias"})
    assert (naive(tokens()) - m(tokens())).abs().max() > 1e-2


def test_pre_rmsnorm_conversion_in_float32():
    m = perturb_(model(dtype=torch.float32))
    rms = to_pre_rmsnorm(m)
    assert next(rms.parameters()).dtype == torch.float32
    torch.testing.assert_close(rms(tokens()), m(tokens()), atol=1e-4, rtol=1e-4)


def test_conversion_refuses_what_it_cannot_convert():
    with pytest.raises(ValueError, match="needs a Pre-LN Transformer"):
        to_pre_rmsnorm(model(position="post"))
    with pytest.raises(ValueError, match="needs a Pre-LN Transformer"):
        center_residual_stream_(model(norm="rms"))
    with pytest.raises(ValueError, match="needs a Pre-LN Transformer"):
        to_pre_rmsnorm(model(final_norm=False))
    m = perturb_(model(bias=False))
    with pytest.raises(ValueError, match="no bias to fold it into"):
        to_pre_rmsnorm(m)
    with pytest.raises(TypeError, match="lnbook Transformer"):
        to_pre_rmsnorm(nn.Linear(2, 2))


def test_state_dict_round_trip_and_from_config():
    m = perturb_(model(norm="dyt", qk_norm=True, position="post"))
    copy = Transformer.from_config(m.config, dtype=torch.float64)
    assert isinstance(m.config, TransformerConfig)
    assert (copy(tokens()) - m(tokens())).abs().max() > 1e-3  # freshly initialized
    copy.load_state_dict(m.state_dict())
    torch.testing.assert_close(copy(tokens()), m(tokens()), atol=0, rtol=0)
    assert {k for k in m.state_dict() if "alpha" in k} == {
        f"blocks.{i}.norm{j}.alpha" for i in range(L) for j in (1, 2)}


@pytest.mark.parametrize("position", ["pre", "post"])
def test_ln_impl_changes_how_not_what(position):
    """ln_impl="torch" (torch's kernel, the default) and "autograd" (chapter 3's code) build
    the same parameters from a seed and give the same outputs and gradients in float64; their
    state dicts load into each other."""
    kw = {"position": position, "qk_norm": True}
    fast, taught = model(ln_impl="torch", **kw), model(ln_impl="autograd", **kw)
    assert TransformerConfig(V, D, H, L, T).ln_impl == "torch" == model().config.ln_impl
    lns = [m for m in taught.modules() if isinstance(m, LayerNorm)]
    assert len(lns) == 2 * L * 2 + (position == "pre") and {m.impl for m in lns} == {"autograd"}
    assert {m.impl for m in fast.modules() if isinstance(m, LayerNorm)} == {"torch"}
    perturb_(fast)
    taught.load_state_dict(fast.state_dict())
    outs = []
    for m in (fast, taught):
        loss = sequence_loss(m(tokens()), tokens(1))
        outs.append((loss, torch.autograd.grad(loss, list(m.parameters()))))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-12)
    for g_fast, g_taught in zip(outs[0][1], outs[1][1], strict=True):
        torch.testing.assert_close(g_fast, g_taught, rtol=1e-10, atol=1e-12)
    assert Transformer.from_config(taught.config).config.ln_impl == "autograd"
    with pytest.raises(ValueError, match="ln_impl must be one of"):
        Transformer(V, D, H, L, T, ln_impl="fused")


def test_deepnorm_constants_and_initialization():
    alpha, beta = deepnorm_constants(6)
    assert alpha == pytest.approx(12 ** 0.25) and beta == pytest.approx(48 ** -0.25)
    torch.manual_seed(0)
    m = Transformer(V, 64, 4, 6, T, position="post", deepnorm=True)
    assert all(b.deepnorm_alpha == pytest.approx(alpha) for b in m.blocks)
    plain = Transformer(V, 64, 4, 6, T, position="post")
    xavier = math.sqrt(2 / (64 + 64))
    with torch.no_grad():
        v_std = torch.stack([b.attn.v_proj.weight for b in m.blocks]).std()
        q_std = torch.stack([b.attn.q_proj.weight for b in m.blocks]).std()
    assert float(v_std) == pytest.approx(beta * xavier, rel=0.05)
    assert float(q_std) == pytest.approx(xavier, rel=0.05)
    assert plain.blocks[0].deepnorm_alpha is None
    with pytest.raises(ValueError, match="needs position='post'"):
        Transformer(V, D, H, L, T, position="pre", deepnorm=True)


def test_dropout_acts_in_training_mode_only():
    m = model(dropout=0.3)
    idx = tokens()
    m.train()
    assert (m(idx) - m(idx)).abs().max() > 0
    m.eval()
    torch.testing.assert_close(m(idx), m(idx), atol=0, rtol=0)


def test_sequence_loss_ignores_unscored_positions():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[-100, 1, 2], [-100, -100, 4]])
    picked = torch.stack([logits[0, 1], logits[0, 2], logits[1, 2]])
    expected = F.cross_entropy(picked, torch.tensor([1, 2, 4]))
    torch.testing.assert_close(sequence_loss(logits, targets), expected)
    with pytest.raises(ValueError, match="expected logits"):
        sequence_loss(logits, targets[:, :2])


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match=r"n_heads \(5\) must divide d_model \(32\)"):
        Transformer(V, 32, 5, L, T)
    with pytest.raises(ValueError, match="norm must be one of"):
        Transformer(V, D, H, L, T, norm="batch")
    with pytest.raises(ValueError, match="position must be one of"):
        config(position="middle")
    with pytest.raises(ValueError, match="n_layers must be a positive int"):
        Transformer(V, D, H, 0, T)
    with pytest.raises(ValueError, match="dropout must lie in"):
        Transformer(V, D, H, L, T, dropout=1.0)
    m = model()
    with pytest.raises(ValueError, match="exceeds max_len=16"):
        m(tokens(length=T + 1))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 13\)"):
        m(torch.full((1, 4), V))
    with pytest.raises(TypeError, match="int64"):
        m(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        m(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention expects input of shape \(B, T, 32\)"):
        m.blocks[0].attn(torch.randn(2, 4, 8, dtype=torch.float64))


def test_one_config_builds_the_model_and_other_forms_are_refused():
    torch.manual_seed(0)
    a = Transformer(config(norm="rms", qk_norm=True), dtype=torch.float64)
    torch.manual_seed(0)
    b = model(norm="rms", qk_norm=True)  # the shorthand: the same config, the same draws
    assert a.config == b.config and a.config is not b.config
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    assert [blk.layer for blk in a.blocks] == list(range(1, L + 1))
    with pytest.raises(TypeError, match="not both"):
        Transformer(config(), norm="rms")
    with pytest.raises(TypeError, match=r"Block\(config, layer=l\), got int"):
        Block(D)
    with pytest.raises(TypeError, match="unexpected keyword argument 'norm'"):
        Block(config(), norm="rms")
    with pytest.raises(TypeError, match="make_norm takes the model's config"):
        make_norm("layer", D)


def test_norm_factory_in_the_config_is_called_for_every_norm():
    """config.norm may be a factory: torch's own RMSNorm here, checked against the formula."""
    m = model(norm=lambda n: nn.RMSNorm(n, eps=1e-6), position="pre")
    norms = [blk.norm1 for blk in m.blocks] + [blk.norm2 for blk in m.blocks] + [m.final_norm]
    assert all(type(n) is nn.RMSNorm and n.weight.dtype == torch.float64 for n in norms)
    perturb_(m)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    blk = m.blocks[0]
    rms = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * blk.norm1.weight
    torch.testing.assert_close(blk.norm1(x), rms, atol=1e-12, rtol=0)
    assert type(make_norm(config(norm="dyt"), 8)) is DyT
    assert make_norm(config(), 8, kind="layer").normalized_shape == (8,)


def ln_ref(x: torch.Tensor, norm: nn.Module, eps: float = 1e-5) -> torch.Tensor:
    """Layer norm written out here (eq. 3), with the gain and bias of ``norm``."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * norm.weight + norm.bias


@pytest.mark.parametrize("scaling", [False, True])
def test_peri_and_output_placements_against_a_hand_written_block(scaling):
    """Peri-LN: x + M(F(N(x))) around each sublayer; OLMo 2's reordered norm: x + N(F(x));
    with LayerNorm Scaling every norm of block l is multiplied by 1/sqrt(l)."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    for layer in (1, 3):
        s = 1 / math.sqrt(layer) if scaling else 1.0
        peri = perturb_(Block(config(position="peri", depth_scaling=scaling), layer=layer,
                              dtype=torch.float64))
        h = x + s * ln_ref(peri.attn(s * ln_ref(x, peri.norm1)), peri.out_norm1)
        want = h + s * ln_ref(peri.mlp(s * ln_ref(h, peri.norm2)), peri.out_norm2)
        torch.testing.assert_close(peri(x), want, atol=1e-12, rtol=0)
        out = perturb_(Block(config(position="output", depth_scaling=scaling), layer=layer,
                             dtype=torch.float64))
        h = x + s * ln_ref(out.attn(x), out.norm1)
        want = h + s * ln_ref(out.mlp(h), out.norm2)
        torch.testing.assert_close(out(x), want, atol=1e-12, rtol=0)
        assert not hasattr(out, "out_norm1")
        pre = perturb_(Block(config(depth_scaling=scaling), layer=layer, dtype=torch.float64))
        h = x + pre.attn(s * ln_ref(x, pre.norm1))
        torch.testing.assert_close(pre(x), h + pre.mlp(s * ln_ref(h, pre.norm2)),
                                   atol=1e-12, rtol=0)


def test_depth_scaled_peri_model_end_to_end_against_a_hand_written_forward():
    """The whole model by hand: embeddings, blocks with norms scaled by 1/sqrt(l), the final
    norm unscaled, the head."""
    m = perturb_(Transformer(TransformerConfig(V, D, H, 3, T, position="peri",
                                               depth_scaling=True), dtype=torch.float64))
    assert m.config.has_final_norm() and type(m.final_norm) is LayerNorm
    idx = tokens()
    x = m.tok_emb.weight[idx] + m.pos_emb.weight[: idx.shape[1]]  # (B, T, D)
    for layer, b in enumerate(m.blocks, start=1):
        s = layer ** -0.5
        x = x + s * ln_ref(b.attn(s * ln_ref(x, b.norm1)), b.out_norm1)
        x = x + s * ln_ref(b.mlp(s * ln_ref(x, b.norm2)), b.out_norm2)
    want = m.head(ln_ref(x, m.final_norm))
    torch.testing.assert_close(m(idx), want, atol=1e-10, rtol=0)
    assert [b.scale for b in m.blocks] == pytest.approx([1.0, 2 ** -0.5, 3 ** -0.5], rel=1e-15)
    assert model(position="output").blocks[0].scale is None
    assert type(model(position="output").final_norm) is LayerNorm
    with pytest.raises(ValueError, match="no depth_scaling"):
        to_pre_rmsnorm(model(depth_scaling=True))
    with pytest.raises(ValueError, match="position must be one of"):
        config(position="sandwich")


def test_rezero_blocks_start_as_the_identity_and_follow_the_gated_formula():
    """ReZero (Bachlechner et al., 2021): no norm in a block, x + a F(x) per branch with a
    learnt scalar a initialized at 0, so the untrained model is the embeddings read by the
    head; after the gates move, each block is the hand-written formula."""
    m = model(norm="none", position="rezero")
    idx = tokens()
    for b in m.blocks:
        assert type(b.norm1) is nn.Identity and type(b.norm2) is nn.Identity
        assert b.alpha_attn.item() == 0.0 and b.alpha_mlp.item() == 0.0
    assert type(m.final_norm) is nn.Identity
    x0 = m.tok_emb.weight[idx] + m.pos_emb.weight[: idx.shape[1]]  # (B, T, D)
    torch.testing.assert_close(m(idx), m.head(x0), atol=1e-12, rtol=0)
    perturb_(m)
    x = m.tok_emb.weight[idx] + m.pos_emb.weight[: idx.shape[1]]  # (B, T, D)
    for b in m.blocks:
        assert b.alpha_attn.item() != 0.0
        x = x + b.alpha_attn * b.attn(x)
        x = x + b.alpha_mlp * b.mlp(x)
    torch.testing.assert_close(m(idx), m.head(x), atol=1e-10, rtol=0)
    # the gates get gradients from the start (the branches' weights do not, at a = 0)
    fresh = model(norm="none", position="rezero")
    sequence_loss(fresh(idx), idx).backward()
    assert fresh.blocks[0].alpha_attn.grad.abs().item() > 0
    assert float(fresh.blocks[0].mlp.fc2.weight.grad.abs().max()) == 0.0
    m.reset_parameters()
    assert m.blocks[1].alpha_mlp.item() == 0.0
    # with norm="layer" only the final norm is a norm: the blocks stay norm-free
    ln_model = model(position="rezero")
    assert type(ln_model.final_norm) is LayerNorm
    assert all(type(b.norm1) is nn.Identity for b in ln_model.blocks)


@pytest.mark.parametrize("width", [1, 5, 13, 15, 16, 40])
def test_softmax_is_torchs_softmax_with_masked_entries(width):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(3, 2, 7, width, dtype=torch.float64, generator=g) * 30  # large logits
    x[..., 1:] = x[..., 1:].masked_fill(torch.rand(x[..., 1:].shape, generator=g) < 0.3,
                                        float("-inf"))
    x.requires_grad_(True)
    w = torch.randn(x.shape, dtype=torch.float64, generator=g)
    mine, ref = softmax(x), x.softmax(dim=-1)
    torch.testing.assert_close(mine, ref, rtol=0, atol=1e-15)
    assert (mine[x.isinf()] == 0).all()
    (grad,) = torch.autograd.grad((mine * w).sum(), x)
    (ref_grad,) = torch.autograd.grad((ref * w).sum(), x)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(softmax(x.float()), ref.float(), rtol=0, atol=1e-6)


def test_softmax_leaves_half_precision_to_torch():
    x = torch.randn(4, 13).bfloat16()
    assert softmax(x).dtype == torch.bfloat16
    assert torch.equal(softmax(x), x.softmax(dim=-1))
