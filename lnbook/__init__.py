"""lnbook: Layer Normalization (Ba, Kiros, Hinton, 2016), a tested reference implementation.

The package behind the executable textbook in ``book/``. Its modules follow the book; see
CONTRIBUTING.md for the map and the book's API page for every public object.
"""

from lnbook import reference
from lnbook.device import resolve_device
from lnbook.norms import BatchNorm, LayerNorm, WeightNormLinear, layer_norm

# --- rnn (chapter 3.1, supplement) ---
# --- end rnn ---

# --- analysis (chapters 4, 5) ---
# --- end analysis ---

# --- data, train (chapter 6) ---
# --- end data, train ---

__version__ = "0.1.0"

__all__ = [
    "BatchNorm",
    "LayerNorm",
    "WeightNormLinear",
    "layer_norm",
    "reference",
    "resolve_device",
    # --- __all__ additions: keep one name per line ---
]
