"""Plain numpy references in float64: layer normalization and the paper's recurrent cells.

:func:`layer_norm_numpy` is eq. 3 as the paper writes it, the oracle :func:`lnbook.layer_norm`
is tested against; it does not call :mod:`lnbook.functional`, so that it cannot share its
mistakes. The ``*_step_paper`` functions are the supplement's cells in the paper's order and
notation (eqs. 4, 20-22, 26-28); ``*_params_paper`` build their parameters from the state dict
of the torch-form cell (:class:`lnbook.LNLSTMCell`, ...) by reordering gates and folding biases,
so that the two compare number for number (Supplement chapter, ``tests/test_rnn.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

__all__ = ["layer_norm_numpy", "lstm_params_paper", "lstm_step_paper", "gru_params_paper",
           "gru_step_paper", "rnn_params_paper", "rnn_step_paper"]

_Params = dict[str, np.ndarray]


def layer_norm_numpy(x: np.ndarray, weight: np.ndarray | None = None,
                     bias: np.ndarray | None = None, eps: float = 1e-5) -> np.ndarray:
    """``(x - mu) / sqrt(sigma^2 + eps) * weight + bias`` over the trailing ``weight.ndim`` axes
    of ``x`` ``(*, *S)`` (eq. 3; chapter 3); ``weight`` None: S is the last axis, gain 1.

    Example::

        >>> layer_norm_numpy(np.array([[1.0, 2.0, 3.0]])).round(3)
        array([[-1.225,  0.   ,  1.225]])
    """
    x = np.asarray(x)
    k = 1 if weight is None else np.ndim(weight)
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)  # eq. 3, left
    sigma2 = ((x - mu) ** 2).mean(axis=axes, keepdims=True)  # eq. 3, right (squared)
    y = (x - mu) / np.sqrt(sigma2 + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


_ln = layer_norm_numpy  # LN(z; alpha, beta) of eqs. 15-16 over the last axis


def _get(sd: Mapping[str, object], name: str, size: int) -> np.ndarray:
    """``sd[name]`` as float64, or zeros where the cell has no such bias (``bias=False``)."""
    v = sd.get(name)
    return np.zeros(size) if v is None else np.asarray(v, dtype=np.float64)


def lstm_params_paper(sd: Mapping[str, object], hidden_size: int) -> _Params:
    """The paper's LSTM parameters from the state dict ``sd`` of an :class:`lnbook.LNLSTMCell`
    or :class:`lnbook.DRAWLSTMCell` with ``hidden_size`` H (Supplement chapter).

    The rows of every 4H array go from torch's gate order (i, f, g, o) to the paper's (f, i, o,
    g); ``bias_ih + bias_hh`` is the paper's b. ``a1, b1`` (LN of W_h h) and ``a2, b2`` (LN of
    W_x x) exist only with ``ln_hh``/``ln_ih``, ``a3, b3`` (LN of c_t) only with ``ln_c``.
    """
    H = hidden_size
    i, f, g, o = (np.arange(k * H, (k + 1) * H) for k in range(4))
    perm = np.concatenate([f, i, o, g])  # torch rows -> paper rows
    arr = functools.partial(_get, sd)
    p = {"W_h": arr("weight_hh", 0)[perm], "W_x": arr("weight_ih", 0)[perm],
         "b": (arr("bias_ih", 4 * H) + arr("bias_hh", 4 * H))[perm]}
    if "ln_hh.weight" in sd:
        p |= {"a1": arr("ln_hh.weight", 0)[perm], "b1": arr("ln_hh.bias", 4 * H)[perm],
              "a2": arr("ln_ih.weight", 0)[perm], "b2": arr("ln_ih.bias", 4 * H)[perm]}
    if "ln_c.weight" in sd:
        p |= {"a3": arr("ln_c.weight", 0), "b3": arr("ln_c.bias", H)}
    return p


def lstm_step_paper(p: _Params, x: np.ndarray, h: np.ndarray, c: np.ndarray,
                    eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 20-22 literally: ``(h_t, c_t)`` from x ``(B, I)``, h, c ``(B, H)`` and ``p`` of
    :func:`lstm_params_paper`. Without ``a1`` the gates are not normalized (eq. 29, DRAW),
    without ``a3`` neither is c_t (eqs. 17-19); the c_t carried on is eq. 21's."""
    if "a1" in p:  # eq. 20
        pre = (_ln(h @ p["W_h"].T, p["a1"], p["b1"], eps)
               + _ln(x @ p["W_x"].T, p["a2"], p["b2"], eps))
    else:  # eq. 29 (or 17)
        pre = h @ p["W_h"].T + x @ p["W_x"].T
    f, i, o, g = np.split(pre + p["b"], 4, axis=1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)  # eq. 21
    cn = _ln(c, p["a3"], p["b3"], eps) if "a3" in p else c
    return _sigmoid(o) * np.tanh(cn), c  # eq. 22


def gru_params_paper(sd: Mapping[str, object], hidden_size: int) -> _Params:
    """The paper's GRU parameters (eqs. 26-28) from the state dict ``sd`` of a layer-normalized
    :class:`lnbook.LNGRUCell` with ``hidden_size`` H.

    The paper's z_p is minus torch's z (eq. 28 against torch's ``(1 - z) n + z h``), and
    ``-LN(v; alpha, beta) = LN(v; -alpha, -beta)``: the z half's LN gains and biases change
    sign. W_h, W_x hold torch's (z, r) rows, W, U its n rows; the betas add torch's biases.
    """
    H = hidden_size
    r, z, n = (slice(k * H, (k + 1) * H) for k in range(3))
    sign = np.concatenate([-np.ones(H), np.ones(H)])  # negate the z half

    def swap(v: np.ndarray) -> np.ndarray:  # torch's 2H LN vectors are (r, z): make them (z, r)
        return np.concatenate([v[H:], v[:H]])

    arr = functools.partial(_get, sd)
    wih, whh = arr("weight_ih", 0), arr("weight_hh", 0)
    bih, bhh = arr("bias_ih", 3 * H), arr("bias_hh", 3 * H)
    b_zr = np.concatenate([bih[z] + bhh[z], bih[r] + bhh[r]])
    return {"W_h": np.concatenate([whh[z], whh[r]]), "W_x": np.concatenate([wih[z], wih[r]]),
            "a1": sign * swap(arr("ln_hh.weight", 0)),
            "b1": sign * swap(arr("ln_hh.bias", 2 * H)),
            "a2": sign * swap(arr("ln_ih.weight", 0)),
            "b2": sign * (swap(arr("ln_ih.bias", 2 * H)) + b_zr),
            "W": wih[n], "a3": arr("ln_in.weight", 0), "b3": arr("ln_in.bias", H) + bih[n],
            "U": whh[n], "a4": arr("ln_hn.weight", 0), "b4": arr("ln_hn.bias", H) + bhh[n]}


def gru_step_paper(p: _Params, x: np.ndarray, h: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Eqs. 26-28 literally: h_t ``(B, H)`` from x ``(B, I)``, h ``(B, H)`` and ``p`` of
    :func:`gru_params_paper`."""
    H = h.shape[1]
    zr = _ln(h @ p["W_h"].T, p["a1"], p["b1"], eps) + _ln(x @ p["W_x"].T, p["a2"], p["b2"], eps)
    z, r = zr[:, :H], zr[:, H:]  # eq. 26
    h_hat = np.tanh(_ln(x @ p["W"].T, p["a3"], p["b3"], eps)
                    + _sigmoid(r) * _ln(h @ p["U"].T, p["a4"], p["b4"], eps))  # eq. 27
    return (1 - _sigmoid(z)) * h + _sigmoid(z) * h_hat  # eq. 28


def rnn_params_paper(sd: Mapping[str, object], hidden_size: int) -> _Params:
    """Eq. 4's W_x, W_h, gain g (none without ``ln``) and bias b (LN's plus torch's two) from
    the state dict ``sd`` of an :class:`lnbook.LNRNNCell` with ``hidden_size`` H."""
    H = hidden_size
    b = _get(sd, "bias_ih", H) + _get(sd, "bias_hh", H) + _get(sd, "ln.bias", H)
    p = {"W_x": _get(sd, "weight_ih", 0), "W_h": _get(sd, "weight_hh", 0), "b": b}
    if "ln.weight" in sd:
        p["g"] = _get(sd, "ln.weight", 0)
    return p


def rnn_step_paper(p: _Params, x: np.ndarray, h: np.ndarray, eps: float = 1e-5,
                   f=np.tanh) -> np.ndarray:
    """Eq. 4: ``h_t = f(g / sigma_t (a_t - mu_t) + b)``, ``a_t = W_x x_t + W_h h_{t-1}``, for
    x ``(B, I)``, h ``(B, H)`` and ``p`` of :func:`rnn_params_paper` (``f(a_t + b)`` without g)."""
    a = x @ p["W_x"].T + h @ p["W_h"].T  # summed inputs
    return f(_ln(a, p["g"], p["b"], eps) if "g" in p else a + p["b"])
