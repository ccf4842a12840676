"""Pick the device an experiment runs on: cuda when present, else mps, else cpu."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` (cuda, then mps, then cpu) or a device name as a :class:`torch.device`;
    ``ValueError`` for one this machine lacks."""
    if isinstance(device, torch.device):
        device = str(device)
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'mps', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use 'auto'")
    mps = getattr(torch.backends, "mps", None)
    if dev.type == "mps" and not (mps is not None and mps.is_available()):
        raise ValueError("device 'mps' was asked for but it is not available; use 'auto' or 'cpu'")
    return dev
