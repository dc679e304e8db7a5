"""One-shot post-training pruning, layer by layer: SparseGPT, Wanda and magnitude on a model.

:func:`prune` runs the pipeline of SparseGPT's ``opt_sequential`` / ``llama_sequential`` and
Wanda's ``prune_wanda`` (IST-DASLab/sparsegpt, locuslab/wanda):

1. The model's repeated blocks are found (the ``nn.ModuleList`` of transformer layers:
   ``transformer.h``, ``model.layers``, ``bert.encoder.layer``; ``blocks=`` names them
   otherwise), and the first block's inputs are captured once per calibration batch, with the
   keyword arguments the model passes it (attention masks, position ids and embeddings), by a
   forward pre-hook that stops the forward there (their ``Catcher``, as a hook).
2. For each block in turn: the statistic its layers' method needs (SparseGPT's hessians
   ``2/n sum x x^T``, Wanda's input norms, or none) is collected from the block's current
   inputs, which come from the blocks already pruned; each layer is pruned by the method
   (a :class:`LayerMethod`: a mask, and for SparseGPT a weight update); then the pruned block
   runs on the same inputs and its outputs replace them as the next block's inputs.

A method is an object that says which statistic it needs and solves one layer
(:class:`SparseGPT`, :class:`Wanda`, :class:`Magnitude`, and :class:`Refine` around any of
them); a per-block sparsity profile is any callable (:class:`OWL` is one). Embeddings, the
LM head, norms and every parameter outside the blocks stay dense. Every forward runs through
``torch.func.functional_call`` with the given params; hooks are removed on exit, also on
errors. With ``inplace=True`` the pruned weights are written into the given tensors (the
module's own where ``params`` does not name them), block by block, so that the memory beyond
the model is one block's work.
"""

from __future__ import annotations

from fprune.oneshot._capture import find_blocks
from fprune.oneshot._methods import LayerMethod, Magnitude, Refine, SparseGPT, Wanda
from fprune.oneshot._pipeline import prune
from fprune.oneshot._pretrained import prune_pretrained
from fprune.oneshot._profiles import OWL
from fprune.oneshot._progress import BlockReport

__all__ = [
    "OWL",
    "BlockReport",
    "LayerMethod",
    "Magnitude",
    "Refine",
    "SparseGPT",
    "Wanda",
    "find_blocks",
    "prune",
    "prune_pretrained",
]
