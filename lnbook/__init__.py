"""lnbook: Layer Normalization (Ba, Kiros, Hinton, 2016), a tested reference implementation.

The package behind the executable textbook in ``book/``; its modules follow the book
(CONTRIBUTING.md has the map, the book's API page every public object). The mathematics of
layer norm lives once, in :mod:`lnbook.functional`.
"""

from lnbook import analysis, bptt, display, functional, reference
from lnbook.analysis import (
    RecurrentDynamics,
    fisher_information,
    invariance_changes,
    invariance_table,
    recurrent_dynamics,
)
from lnbook.bptt import ln_lstm_recurrence
from lnbook.conformance import check_norm
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
from lnbook.engine import Batches, History, fit
from lnbook.norms import BatchNorm, ChannelLayerNorm, LayerNorm, WeightNormLinear, layer_norm
from lnbook.recurrent_bn import BatchNormRNN, RecurrentBNLSTM, SequenceBatchNorm
from lnbook.rnn import GRU, LSTM, RNN, DRAWLSTMCell, LNGRUCell, LNLSTMCell, LNRNNCell
from lnbook.table import Table, glue
from lnbook.transformer import Block, Transformer, TransformerConfig, to_pre_rmsnorm
from lnbook.variants import DyT, GroupNorm, RMSNorm, dyt, group_norm, rms_norm

__version__ = "0.2.0"

__all__ = [
    # norms (chapters 2-4)
    "BatchNorm", "ChannelLayerNorm", "LayerNorm", "WeightNormLinear", "layer_norm",
    "functional", "reference",
    # recurrent (chapter 3.1, supplement)
    "BatchNormRNN", "DRAWLSTMCell", "GRU", "LNGRUCell", "LNLSTMCell", "LNRNNCell", "LSTM",
    "RNN", "RecurrentBNLSTM", "SequenceBatchNorm", "bptt", "ln_lstm_recurrence",
    # analysis (chapters 4, 5)
    "RecurrentDynamics", "analysis", "fisher_information", "invariance_changes",
    "invariance_table", "recurrent_dynamics",
    # data and training (chapter 6)
    "Batches", "History", "MNISTData", "binarize", "fit", "load_mnist", "pixel_permutation",
    "resolve_device",
    # what every chapter prints its numbers with
    "Table", "display", "glue",
    # Part II: normalization after 2016
    "variants", "rms_norm", "RMSNorm", "group_norm", "GroupNorm", "dyt", "DyT", "transformer",
    "Block", "Transformer", "TransformerConfig", "to_pre_rmsnorm", "copy_task", "sort_task",
    "associative_recall", "load_digits_tensor",
    # chapter 13: check a reader's own norm against the forms the book teaches
    "check_norm",
]
