"""The passes edit traces only through minijit/ir/rewrite.py: `rewrite` (a rule per bound symbol), `Edits`
(by position) and `record` (what a function records, placed by the caller).

A pass that assigns into, splices, deletes from or appends to a trace's `bound_symbols` (or a list
copied from it) is named with its file and line; `Edits` itself is run and compared with eager torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from minijit.ir import TensorProxy, Trace, tracing
from minijit.ir.rewrite import Edits, record
from minijit.ops import ltorch
from minijit.runtime import trace_callable
from minijit.transforms.verify import check_trace

ROOT = Path(__file__).resolve().parents[2]

_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"}


def _sources() -> list[Path]:
    """The passes (minijit/transforms/) and the pipeline that runs them."""
    return [*sorted((ROOT / "minijit" / "transforms").rglob("*.py")), ROOT / "minijit" / "runtime" / "pipeline.py"]


def _is_bound_symbols(node: ast.AST, aliases: set[str]) -> bool:
    """`<x>.bound_symbols`, or a name bound to it or to a copy of it (`bsyms = list(t.bound_symbols)`)."""
    if isinstance(node, ast.Attribute) and node.attr == "bound_symbols":
        return True
    return isinstance(node, ast.Name) and node.id in aliases


def _aliases(tree: ast.AST) -> set[str]:
    """Names (and `self.` attributes, by attribute name) bound to a trace's bound symbols or a list copy of them."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "list" and value.args:
            value = value.args[0]
        if isinstance(value, ast.Attribute) and value.attr == "bound_symbols":
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def trace_edits_outside_rewrite(source: str) -> list[int]:
    """The lines of `source` that edit a trace's bound symbols in place instead of through minijit/ir/rewrite.py."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    lines: list[int] = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Subscript) and _is_bound_symbols(t.value, aliases):
                lines.append(t.lineno)  # bound_symbols[i] = ..., [a:b] = ..., del ...[a:], += ...
            elif isinstance(t, ast.Attribute) and t.attr == "bound_symbols":
                lines.append(t.lineno)  # trace.bound_symbols = [...]
            elif isinstance(node, ast.AugAssign) and _is_bound_symbols(t, aliases):
                lines.append(t.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS
                and _is_bound_symbols(node.func.value, aliases)):
            lines.append(node.lineno)  # bound_symbols.insert(...), .append(...)
    return sorted(lines)


def test_no_pass_edits_bound_symbols_outside_rewrite():
    found = []
    for path in _sources():
        text = path.read_text()
        lines = text.splitlines()
        for lineno in trace_edits_outside_rewrite(text):
            found.append(f"{path.relative_to(ROOT)}:{lineno}: {lines[lineno - 1].strip()}")
    assert not found, ("edits of a trace's bound_symbols outside minijit/ir/rewrite.py (use `rewrite`, `Edits` or "
                       "`record` there):\n" + "\n".join(found))


def test_the_edit_check_catches_what_it_is_for():
    bad = ["trace.bound_symbols[i] = rep", "fwd.bound_symbols[a:a] = fwd.bound_symbols[n:]",
           "del fwd.bound_symbols[n:]", "fwd.bound_symbols[:0] = head", "t.bound_symbols.insert(0, b)",
           "self.new.bound_symbols.append(b)", "t.bound_symbols = kept", "t.bound_symbols += more",
           "bsyms = list(trace.bound_symbols)\nbsyms[3] = rep", "bsyms = t.bound_symbols\nbsyms.pop()"]
    good = ["edits.replace(i, rep)", "bsym = trace.bound_symbols[i]", "out = list(trace.bound_symbols)\nn = out[0]",
            "kept.append(b)", "for b in trace.bound_symbols[start:]: pass"]
    assert all(trace_edits_outside_rewrite(code) for code in bad), [c for c in bad if not trace_edits_outside_rewrite(c)]
    assert not any(trace_edits_outside_rewrite(code) for code in good)


def _chain() -> Trace:
    """exp(a), then sin of it, then a sum with b."""
    t = Trace("chain")
    with tracing(t):
        a, b = (t.add_input(TensorProxy((2, 3), torch.float32, torch.device("cpu")), n) for n in "ab")
        e = ltorch.exp(a)
        s = ltorch.sin(e)
        t.output = ltorch.add(s, b)
    return t


@pytest.fixture
def ab() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(2, 3), torch.randn(2, 3)


def test_edits_replace_insert_and_drop_by_position(ab):
    t = _chain()
    printed = t.python()
    exp_b, sin_b, _ = t.bound_symbols
    e, s = exp_b.output, sin_b.output
    # sin(e) -> cos(e), computing sin's very output (later readers unchanged).
    _, (cos_b,) = record(t, ltorch.cos, (e,))
    cos_b = cos_b.replace(output=s)
    (_, before_sin), (_, after_exp) = record(t, ltorch.neg, (e,)), record(t, ltorch.abs, (e,))  # unread
    edits = Edits(t)
    edits.replace(1, cos_b)
    edits.insert_before(1, before_sin)
    edits.insert_after(0, after_exp)
    edits.drop(1)  # a later call for a position wins: sin goes, cos with it
    edits.replace(1, cos_b)
    assert edits[1] is cos_b and edits[0] is exp_b
    after = edits.apply(pass_name="sin to cos")
    check_trace(after)
    assert [b.sym for b in after.bound_symbols] == [ltorch.exp, ltorch.abs, ltorch.neg, ltorch.cos, ltorch.add]
    a, b = ab
    torch.testing.assert_close(trace_callable(after)(a, b), torch.cos(torch.exp(a)) + b)
    assert t.python() == printed  # the input trace is left as it was
    torch.testing.assert_close(trace_callable(t)(a, b), torch.sin(torch.exp(a)) + b)


def test_edits_drop_and_insert_at_the_end(ab):
    t = _chain()
    _, (neg_b,) = record(t, ltorch.neg, (t.output,))
    edits = Edits(t)
    edits.insert_before(len(t.bound_symbols), [neg_b])
    without = Edits(t)
    assert not without and without.bound_symbols() == t.bound_symbols
    after = edits.apply(pass_name="negate", output=neg_b.output)
    check_trace(after)
    a, b = ab
    torch.testing.assert_close(trace_callable(after)(a, b), -(torch.sin(torch.exp(a)) + b))
