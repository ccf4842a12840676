"""Pick the device an experiment runs on: cuda when present, else mps, else cpu."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` (cuda, then mps, then cpu) or a device name as a :class:`torch.device`;
    ``ValueError`` for one this machine lacks."""
    if isinstance(device, torch.device):
        device = str(device)
    mps = getattr(torch.backends, "mps", None)
    has_mps = mps is not None and mps.is_available()
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if has_mps else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'mps', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use 'auto'")
    if dev.type == "mps" and not has_mps:
        raise ValueError("device 'mps' was asked for but it is not available; use 'auto' or 'cpu'")
    return dev
