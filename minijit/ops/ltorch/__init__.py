"""ltorch: torch-level ops, each declared once with its decomposition into prims.

Importing this package declares every op and fills the table from torch callables
(`torch.add`, `torch.Tensor.add`, `torch.nn.functional.gelu`, ...) to symbols.
"""

from minijit.ops import aliases, opaque
from minijit.ops.ltorch import (  # noqa: F401 - declares the ops
    backward,
    conv,
    creation,
    elementwise,
    indexing,
    inplace,
    moe,
    nn,
    norms,
    pooling,
    randomness,
    reductions,
    resample,
    rnn,
    shape,
)
from minijit.ops.registry import ALL_LTORCH

inplace.declare_inplace_variants()
# Aliases (`torch.absolute`, `torch.special.expit`, `Tensor.arccos_`) stand for their op's symbol.
aliases.install()
# Tensor methods on proxies become opaque torch ops where ltorch has none or declines the call.
opaque.install_tensor_method_fallbacks()

globals().update(ALL_LTORCH)
