"""lnbook: Layer Normalization (Ba, Kiros, Hinton, 2016), a tested reference implementation.

The package behind the executable textbook in ``book/``. Its modules follow the book (see
CONTRIBUTING.md for the map, and the book's API page for every public object):

- :mod:`lnbook.functional`: layer norm's mathematics once, on rows: eq. 3 with the variants the
  book teaches as keywords, and the backward derived in chapter 3
- :mod:`lnbook.norms`: ``layer_norm``, ``LayerNorm``, ``ChannelLayerNorm``, ``BatchNorm``,
  ``WeightNormLinear`` (eqs. 1-3, 5, 15-16; chapters 2, 3, 4, 6.7)
- :mod:`lnbook.reference`: ``layer_norm_numpy`` (eq. 3) and the paper's recurrent cells
  (eqs. 4, 20-22, 26-28) in plain numpy (chapter 3, supplement)
- :mod:`lnbook.rnn`: layer-normalized RNN, LSTM, GRU and DRAW cells and sequence layers, drop-ins
  for torch's (eqs. 4, 20-31; chapter 3.1 and the supplement)
- :mod:`lnbook.bptt`: the LN-LSTM's backpropagation through time, derived by hand (supplement)
- :mod:`lnbook.recurrent_bn`: batch normalization with per-step statistics and the recurrent
  models built on it, the comparison of sections 3.1 and 6.2
- :mod:`lnbook.analysis`: Table 1 recomputed, Fisher information and metrics, recurrent
  dynamics (eqs. 5-14, 32-35; chapters 3.1, 4, 5.1, 5.2)
- :mod:`lnbook.data`, :mod:`lnbook.train`, :mod:`lnbook.experiments`: MNIST, the training
  loop with checkpoint and resume, the mini-experiments of section 6 (chapters 6.1-6.7)
- :mod:`lnbook.variants`: ``rms_norm``, ``RMSNorm``, ``group_norm``, ``GroupNorm``, ``DyT``
  (Part II: normalization after 2016)
- :mod:`lnbook.transformer`: a small Transformer built from one ``TransformerConfig`` (the
  norm's kind and place, qk-norm, DeepNorm), and the Pre-LN to Pre-RMSNorm conversion (Part II)
"""

from lnbook import analysis, bptt, functional, reference
from lnbook.analysis import (
    RecurrentDynamics,
    fisher_information,
    invariance_changes,
    invariance_table,
    recurrent_dynamics,
)
from lnbook.bptt import ln_lstm_recurrence
from lnbook.data import (
    MNISTData,
    associative_recall,
    binarize,
    copy_task,
    load_digits_tensor,
    load_mnist,
    pixel_permutation,
    sort_task,
)
from lnbook.device import resolve_device
from lnbook.norms import BatchNorm, ChannelLayerNorm, LayerNorm, WeightNormLinear, layer_norm
from lnbook.recurrent_bn import BatchNormRNN, RecurrentBNLSTM, SequenceBatchNorm
from lnbook.rnn import GRU, LSTM, RNN, DRAWLSTMCell, LNGRUCell, LNLSTMCell, LNRNNCell
from lnbook.table import Table, glue
from lnbook.train import Batches, History, fit
from lnbook.transformer import Block, Transformer, TransformerConfig, to_pre_rmsnorm
from lnbook.variants import DyT, GroupNorm, RMSNorm, dyt, group_norm, rms_norm

__version__ = "0.1.0"

__all__ = [
    # norms (chapters 2-4)
    "BatchNorm",
    "ChannelLayerNorm",
    "LayerNorm",
    "WeightNormLinear",
    "layer_norm",
    "functional",
    "reference",
    # recurrent (chapter 3.1, supplement)
    "BatchNormRNN",
    "DRAWLSTMCell",
    "GRU",
    "LNGRUCell",
    "LNLSTMCell",
    "LNRNNCell",
    "LSTM",
    "RNN",
    "RecurrentBNLSTM",
    "SequenceBatchNorm",
    "bptt",
    "ln_lstm_recurrence",
    # analysis (chapters 4, 5)
    "RecurrentDynamics",
    "analysis",
    "fisher_information",
    "invariance_changes",
    "invariance_table",
    "recurrent_dynamics",
    # data and training (chapter 6)
    "Batches",
    "History",
    "MNISTData",
    "binarize",
    "fit",
    "load_mnist",
    "pixel_permutation",
    "resolve_device",
    # what every chapter prints its numbers with
    "Table",
    "glue",
    # Part II: normalization after 2016
    "variants",
    "rms_norm",
    "RMSNorm",
    "group_norm",
    "GroupNorm",
    "dyt",
    "DyT",
    "transformer",
    "Block",
    "Transformer",
    "TransformerConfig",
    "to_pre_rmsnorm",
    "copy_task",
    "sort_task",
    "associative_recall",
    "load_digits_tensor",
]
