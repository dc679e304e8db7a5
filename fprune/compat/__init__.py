"""fprune.compat: a drop-in ``torch.nn.utils.prune`` built on fprune's functional core.

Swap one import and legacy code runs unchanged::

    import fprune.compat as prune        # instead of: import torch.nn.utils.prune as prune

Same public names, signatures, defaults, return values, exception types, module
re-parametrization (``name_orig`` Parameter, ``name_mask`` buffer in the parameter's dtype,
forward pre-hook, ``remove``) and, under the same ``torch.manual_seed``, the same masks as
torch (random methods draw from the global generator exactly as torch does). Every mask the
built-in methods install is selected by the core (:func:`fprune.l1_unstructured`,
:func:`fprune.ln_structured`, :func:`fprune.global_unstructured`, ...). Hooks and methods of
both libraries are interchangeable: a module pruned by one can be pruned further, inspected and
``remove``-d by the other.

Fixed relative to torch: ``copy.deepcopy``/``pickle`` of pruned models (pytorch#37322); hooks
keep no copy of the mask (pytorch#34257); ``global_unstructured`` builds no concatenated copy
of all scores and masks, and accepts generators; a failing call leaves the modules exactly as
they were; clearer exceptions (subclasses of the types torch raises).

Bridges to the functional world: :func:`hooks_to_functional`, :func:`strip_pruning`,
:func:`functional_to_hooks`, :func:`load_pruned_state_dict`.

Example:
    >>> import torch
    >>> import fprune.compat as prune
    >>> m = prune.l1_unstructured(torch.nn.Linear(3, 2), name="weight", amount=2)
    >>> sorted(m.state_dict().keys()), int((m.weight == 0).sum())
    (['bias', 'weight_mask', 'weight_orig'], 2)
"""

from fprune import _torch
from fprune.compat._errors import (
    DeviceMismatchError,
    ImportanceScoresShapeError,
    InvalidNormError,
    MaskShapeError,
    MultiplePruningHooksError,
    NotPrunedError,
)
from fprune.compat.bridges import (
    functional_to_hooks,
    hooks_to_functional,
    load_pruned_state_dict,
    strip_pruning,
)
from fprune.compat.functions import (
    custom_from_mask,
    global_unstructured,
    identity,
    is_pruned,
    l1_unstructured,
    ln_structured,
    random_structured,
    random_unstructured,
    remove,
)
from fprune.compat.methods import (
    BasePruningMethod,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    PruningContainer,
    RandomStructured,
    RandomUnstructured,
)

# torch's private helpers (those this torch has), for custom methods written against them
# (``prune._compute_nparams_toprune``); see fprune._torch.
globals().update(_torch.PRUNE_HELPERS)

__all__ = [
    # torch.nn.utils.prune's public names
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "remove",
    "is_pruned",
    # bridges to fprune's functional masks
    "hooks_to_functional",
    "strip_pruning",
    "functional_to_hooks",
    "load_pruned_state_dict",
    # exceptions (subclasses of what torch raises)
    "DeviceMismatchError",
    "ImportanceScoresShapeError",
    "InvalidNormError",
    "MaskShapeError",
    "MultiplePruningHooksError",
    "NotPrunedError",
]
