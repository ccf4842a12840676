"""nGPT (lnbook.ngpt): every vector on the sphere, the block's step, the projection."""

import math

import pytest
import torch

from lnbook.ngpt import NGPT, NGPTConfig, Scale, unit
from lnbook.transformer import Transformer


def small(**kw):
    torch.manual_seed(0)
    return NGPT(NGPTConfig(vocab_size=9, d_model=12, n_heads=3, n_layers=2, max_len=8, **kw))


def test_every_matrix_starts_on_the_sphere_and_project_puts_it_back():
    model = small()
    for name, dim in model.matrices():
        w = model.get_parameter(name)
        assert torch.allclose(w.norm(dim=dim), torch.ones(()), atol=1e-6), name
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0).add_(0.1)
    model.project_()
    for name, dim in model.matrices():
        assert torch.allclose(model.get_parameter(name).norm(dim=dim), torch.ones(()),
                              atol=1e-6), name
    # the directions: "o" maps into the model space, so its columns are the unit vectors
    o = model.blocks[0].o.weight
    assert torch.allclose(o.norm(dim=0), torch.ones(12), atol=1e-6)


def test_the_hidden_state_stays_on_the_sphere_and_the_block_is_eq_of_the_paper():
    model = small().double()
    x = torch.randint(0, 9, (2, 8))
    h0 = unit(model.tok_emb(x) + model.pos_emb(torch.arange(8)))
    block = model.blocks[0]
    h = block(h0)
    assert torch.allclose(h.norm(dim=-1), torch.ones(2, 8, dtype=torch.float64), atol=1e-12)
    # by hand: h <- unit(h + alpha_A (unit(h_A) - h)), then the same with the MLP
    a = unit(h0 + 0.05 * (unit(block.attention(h0)) - h0))
    want = unit(a + 0.05 * (unit(block.mlp(a)) - a))
    assert torch.allclose(h, want, atol=1e-12)


def test_attention_is_a_scaled_cosine_and_causal():
    model = small().double()
    block = model.blocks[0]
    h = unit(torch.randn(1, 8, 12, dtype=torch.float64))
    y = block.attention(h)
    # changing the last position leaves every earlier output unchanged (causal)
    h2 = h.clone()
    h2[0, -1] = unit(torch.randn(12, dtype=torch.float64))
    assert torch.allclose(block.attention(h2)[0, :-1], y[0, :-1], atol=1e-12)
    # query and key are unit vectors times s_qk = 1 at the start: logits are sqrt(d_h) cos
    q = unit(block.q(h).view(1, 8, 3, 4))[0, :, 0]
    k = unit(block.k(h).view(1, 8, 3, 4))[0, :, 0]
    cos = q @ k.T
    assert cos.abs().max() <= 1 + 1e-12
    assert block.s_qk().tolist() == pytest.approx([1.0] * 12)
    assert math.sqrt(4) == 2.0


def test_scale_starts_at_init_and_moves_at_the_stored_pace():
    s = Scale(5, init=0.05, scale=0.25)
    assert s().tolist() == pytest.approx([0.05] * 5)
    assert s.param.tolist() == pytest.approx([0.25] * 5)
    s().sum().backward()
    assert s.param.grad.tolist() == pytest.approx([0.2] * 5)  # d(p * init/scale)/dp


def test_weights_match_a_bias_free_transformer_within_one_percent():
    ngpt = NGPT(9, 32, 4, 2, 8)  # the book's width: SwiGLU 85 wide against GELU's 128
    pre = Transformer(9, 32, 4, 2, 8, bias=False)
    a = sum(p.numel() for p in ngpt.parameters())
    b = sum(p.numel() for p in pre.parameters())
    assert (a, b) == (25885, 25728) and abs(a - b) / b < 0.01


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_heads"):
        NGPTConfig(9, 10, 3, 1, 8)
    with pytest.raises(ValueError, match="alpha_init"):
        NGPTConfig(9, 12, 3, 1, 8, alpha_init=0.0)
    model = small()
    with pytest.raises(TypeError, match="int64"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="T <= 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
