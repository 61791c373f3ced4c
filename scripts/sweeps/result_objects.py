"""For the first samples of each OpInfo op: which results are the input objects themselves, and which are one
object, in eager and jitted (a view that changes nothing is a new object in eager, `x.contiguous()` is `x`)."""
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

import minijit

warnings.filterwarnings("ignore")
bad = []
n = 0
for op in op_db:
    samples = None
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:4]
    except Exception:
        continue
    for s in samples:
        args = (s.input, *s.args)
        kwargs = dict(s.kwargs)
        fn = op.op
        try:
            e = fn(*args, **kwargs)
        except Exception:
            continue
        def f(*a, fn=fn, **k):
            return fn(*a, **k)
        try:
            m = minijit.jit(f)(*args, **kwargs)
        except Exception:
            continue
        n += 1
        flat_e = list(e) if isinstance(e, (tuple, list)) else [e]
        flat_m = list(m) if isinstance(m, (tuple, list)) else [m]
        ins = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if isinstance(s.input, (tuple, list)):
            ins += [t for t in s.input if isinstance(t, torch.Tensor)]
        ie = [any(o is i for i in ins) for o in flat_e]
        im = [any(o is i for i in ins) for o in flat_m]
        same_e = [any(a is b for b in flat_e[:j]) for j, a in enumerate(flat_e)]
        same_m = [any(a is b for b in flat_m[:j]) for j, a in enumerate(flat_m)]
        if ie != im or same_e != same_m:
            bad.append((op.name, op.variant_test_name, ie, im, same_e, same_m))
            print("DIFF", bad[-1], flush=True)
print("samples", n, "diffs", len(bad))
