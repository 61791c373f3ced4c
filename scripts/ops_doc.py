"""Write docs/ops.md: every torch op, and how minijit runs it (decomposed, opaque, or refused with the reason).

The ops are the torch callables of `torch`, `torch.Tensor` (methods), `torch.nn.functional`,
`torch.linalg`, `torch.fft` and `torch.special` that minijit treats as ops (its ltorch
symbols, and the callables `minijit.ops.opaque.is_opaque_candidate` accepts). For each:

- **decomposed**: an ltorch symbol (fusible; gradient from minijit's VJP rules). Where
  its decomposition declines a form of the call, that call runs opaque instead;
- **opaque**: one torch call in the trace, metadata from torch's meta kernels, effects
  from the operator's schema, gradient from torch's autograd;
- **run on the values while tracing**: an op whose result's shape depends on the values
  (`nonzero`), and `Tensor.tolist`: run on the real values by the capture, checked per call;
- **refused**: a clear error at trace time, with the reason (read from torch's own
  operator tags and kernel registrations, so it is known without running anything).

Run: python scripts/ops_doc.py            (writes docs/ops.md)
     python scripts/ops_doc.py --check    (exit status 1 if docs/ops.md is out of date)
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from minijit.ir import TENSOR_METHODS, Symbol, TensorProxy
from minijit.ir.proxies import OPERATOR_METHODS
from minijit.ops.aliases import canonical
from minijit.ops.ltorch.inplace import METADATA_INPLACE
from minijit.ops.opaque import NOT_OPS, is_opaque_candidate
from minijit.ops.registry import ltorch_symbol_for
from minijit.ops.strides import LAYOUT_QUERIES

DOC = Path(__file__).resolve().parent.parent / "docs" / "ops.md"
NAMESPACES = {"torch": torch, "torch.Tensor": torch.Tensor, "torch.nn.functional": torch.nn.functional,
              "torch.linalg": torch.linalg, "torch.fft": torch.fft, "torch.special": torch.special}
# The ATen operator name prefix of each namespace's functions (`torch.linalg.solve` is `aten::linalg_solve`).
ATEN_PREFIX = {"torch.linalg": "linalg_", "torch.fft": "fft_", "torch.special": "special_"}
DATA_DEPENDENT = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
META_KEYS = ("Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
             "CompositeExplicitAutogradNonFunctional")


# Tensor methods a proxy answers itself from its metadata (`x.dim()`, `x.size(0)`): no op is recorded.
METADATA = sorted([n for n in dir(TensorProxy) if not n.startswith("_") and hasattr(torch.Tensor, n)
                   and n not in OPERATOR_METHODS] + list(LAYOUT_QUERIES))


def _members(prefix: str, ns: Any) -> Iterator[tuple[str, Any]]:
    """(name, callable) of the ops in one namespace, sorted by name (Tensor: operators that proxies implement)."""
    names = dir(ns) if isinstance(ns, type) else list(vars(ns))
    for name in sorted(set(names)):
        if name.startswith("_") and not (prefix == "torch.Tensor" and name in OPERATOR_METHODS):
            continue
        if prefix == "torch.Tensor" and name in METADATA:
            continue
        value = getattr(ns, name, None)
        if value is None or isinstance(value, type | types.ModuleType) or not callable(value):
            continue
        if prefix == "torch.Tensor" and name in LAYOUT_QUERIES:
            continue  # answered from the proxy's layout: listed with the metadata
        if prefix == "torch.Tensor" and name in TENSOR_METHODS:
            yield name, value
        elif ltorch_symbol_for(value) is not None or is_opaque_candidate(value):
            yield name, value


def _aten_overloads(prefix: str, name: str, fn: Any) -> list[Any]:
    """The ATen overloads a callable's name stands for (`torch.nonzero` -> aten::nonzero.*), if any."""
    op_name = getattr(canonical(fn), "__name__", name) or name
    candidates = [ATEN_PREFIX.get(prefix, "") + op_name, op_name]
    for candidate in candidates:
        packet = getattr(torch.ops.aten, candidate, None)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            return [getattr(packet, o) for o in packet.overloads()]
    return []


def _has_meta(overload: Any) -> bool:
    try:
        return any(torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), key) for key in META_KEYS)
    except RuntimeError:  # an overload torch defines in Python only (no dispatcher entry): assume it runs
        return True


def _symbol(prefix: str, name: str, fn: Any) -> Symbol | None:
    if prefix == "torch.Tensor":
        method = TENSOR_METHODS.get(OPERATOR_METHODS.get(name, (name,))[0])
        method = getattr(method, "__wrapped__", method)
        if isinstance(method, Symbol):
            return method
    return ltorch_symbol_for(fn)


def classify(prefix: str, name: str, fn: Any) -> tuple[str, str]:
    """("decomposed" | "opaque" | "read" | "refused", detail) for one op."""
    if prefix == "torch.Tensor" and name.endswith("_") and name[:-1] in METADATA_INPLACE:
        return "refused", "changes the tensor's shape or metadata in place; write x = x.op(...) instead"
    sym = _symbol(prefix, name, fn)
    if sym is not None:
        return "decomposed", sym.id
    if prefix == "torch.Tensor" and name == "backward":
        return "decomposed", "autograd.grad_of"  # gradients taken inside the trace (minijit/frontend/backward.py)
    if prefix == "torch.Tensor" and name in NOT_OPS:
        return "refused", "acts on autograd, storage, devices or other layouts rather than computing from the values"
    if prefix == "torch.Tensor" and name in TENSOR_METHODS:
        return "read", ""  # a method reading the values themselves (tolist)
    overloads = _aten_overloads(prefix, name, fn)
    if overloads and not any("Tensor" in str(r.type) for o in overloads for r in o._schema.returns):
        return "refused", "returns a Python value, not a tensor"
    if overloads and all(any(tag in o.tags for tag in DATA_DEPENDENT) for o in overloads):
        return "read", ""
    if overloads and not any(_has_meta(o) for o in overloads):
        return "refused", "torch has no meta kernel for it, so its output shape is unknown"
    return "opaque", ""


def generate() -> str:
    """The text of docs/ops.md for the installed torch and this minijit."""
    sections: list[str] = []
    totals = {"decomposed": 0, "opaque": 0, "read": 0, "refused": 0}
    for prefix, ns in NAMESPACES.items():
        rows = {"decomposed": [], "opaque": [], "read": [], "refused": []}
        for name, fn in _members(prefix, ns):
            status, detail = classify(prefix, name, fn)
            rows[status].append((name, detail))
            totals[status] += 1
        decomposed = ", ".join(f"`{n}`" if d.split(".")[-1] == n else f"`{n}` ({d.split('.', 1)[1]})"
                               for n, d in rows["decomposed"])
        sections += [f"## `{prefix}`", ""]
        if prefix == "torch.Tensor":
            sections += [f"**Answered from the proxy's metadata ({len(METADATA)}):** "
                         f"{', '.join(f'`{n}`' for n in METADATA)}", ""]
        sections += [
            f"**Decomposed ({len(rows['decomposed'])}):** {decomposed or '-'}", "",
            f"**Opaque ({len(rows['opaque'])}):** {', '.join(f'`{n}`' for n, _ in rows['opaque']) or '-'}", "",
            f"**Run on the values while tracing ({len(rows['read'])}):** "
            f"{', '.join(f'`{n}`' for n, _ in rows['read']) or '-'}", "",
            f"**Refused ({len(rows['refused'])}):**", "",
        ]
        if rows["refused"]:
            sections += ["| op | reason |", "| --- | --- |"] + [f"| `{n}` | {d} |" for n, d in rows["refused"]]
        sections.append("")
    header = [
        "# Ops: how minijit runs each torch op",
        "",
        f"Generated by `python scripts/ops_doc.py` for torch {torch.__version__}; do not edit by hand "
        "(tests/ops/test_ops_doc.py checks it is up to date).",
        "",
        "- **decomposed**: an ltorch symbol, decomposed into prims (fusible; gradient from minijit's VJP rules), "
        "shown with the symbol's name where it differs. A form of a call its decomposition declines "
        "(`F.pad(mode='reflect')`, `flip(dims=...)`) runs opaque instead.",
        "- **opaque**: one torch call in the trace, run by the torch executor: shapes and dtypes from torch's meta "
        "kernels, views and in-place writes from the operator's schema, gradient from torch's autograd "
        "(minijit/ops/opaque.py). A call whose result is not tensors, or whose meta kernel rejects it, is refused "
        "with the reason when traced.",
        "- **run on the values while tracing**: the result's shape (or, for `tolist`, its values) depends on the "
        "input's values: the capture runs the op on the call's real values and the trace checks the shapes (values) "
        "on every call, one cache entry per shape seen (minijit/runtime/values.py). Refused with `out=` or inside a "
        "traced `autograd.Function`.",
        "- **refused**: a `MinijitError` naming the op and the line, for the reason given.",
        "",
        f"Totals: {totals['decomposed']} decomposed, {totals['opaque']} opaque, {totals['read']} run on the values "
        f"while tracing, {totals['refused']} refused. "
        "Measured coverage: tests/ops/test_opinfo.py runs PyTorch's OpInfo database and prints a summary.",
        "",
    ]
    return "\n".join(header + sections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/ops.md differs from the generated text")
    opts = parser.parse_args()
    text = generate()
    if opts.check:
        sys.exit(0 if DOC.read_text() == text else 1)
    DOC.write_text(text)
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
