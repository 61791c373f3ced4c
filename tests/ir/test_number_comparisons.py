"""A comparison operator on a number proxy has one meaning: the outcome, guarded. Outside a capture it raises
(a pass replaying ops the capture recorded included); a pass decides with `same_value` / `same_shape` /
`known_compare`, an op's rules with `rule_compare` / `rule_same_shape`."""

from __future__ import annotations

import ast
import operator
from pathlib import Path

import pytest
import torch

from minijit.errors import UnguardedComparisonError
from minijit.ir import IntegerProxy
from minijit.ir.context import knowing_constraints, recording_constraints, replaying_captured
from minijit.ir.proxies import known_compare, rule_compare, rule_same_shape

ROOT = Path(__file__).resolve().parents[2]
OPERATORS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
             ">=": operator.ge}


def _holds(constraints: list[str], size: int, other_size: int | None = None) -> bool:
    """Whether the recorded constraints hold for inputs x of shape (size,) and y of shape (other_size,)."""
    env = {"x": torch.empty(size), "y": torch.empty(size if other_size is None else other_size)}
    return all(eval(c, env) for c in constraints)  # a guard is a Python expression


@pytest.mark.parametrize("op", OPERATORS)
def test_a_comparison_operator_outside_a_capture_raises(op):
    n = IntegerProxy(4, expr="x.shape[0]")
    with pytest.raises(UnguardedComparisonError, match="only a capture can guard"):
        OPERATORS[op](n, 3)  # no compile at all
    with knowing_constraints([]), pytest.raises(UnguardedComparisonError):
        OPERATORS[op](3, n)  # a pass: reflected, the proxy's operator still answers
    with knowing_constraints([]), pytest.raises(UnguardedComparisonError):
        OPERATORS[op](n, IntegerProxy(4, expr="y.shape[0]"))


@pytest.mark.parametrize("op", OPERATORS)
@pytest.mark.parametrize("other", [3, 4, 5])
def test_a_comparison_operator_in_a_capture_is_the_value_s_outcome_guarded(op, other):
    n = IntegerProxy(4, expr="x.shape[0]")
    with recording_constraints() as recorded:
        got = OPERATORS[op](n, other)
    assert got == OPERATORS[op](4, other)
    assert recorded and _holds(recorded, 4)
    # The guard admits exactly the sizes for which the outcome is the same.
    for size in range(1, 8):
        assert _holds(recorded, size) == (OPERATORS[op](size, other) == got), size


@pytest.mark.parametrize("op", OPERATORS)
def test_rule_compare_guards_in_a_capture_and_asks_the_known_facts_in_a_pass(op):
    n, m = IntegerProxy(4, expr="x.shape[0]"), IntegerProxy(4, expr="y.shape[0]")
    with recording_constraints() as recorded:
        in_capture = rule_compare(n, op, m)
    assert in_capture == OPERATORS[op](4, 4) and recorded
    known: list[str] = []
    with knowing_constraints(known):
        assert rule_compare(n, op, m) == known_compare(n, op, m)
        assert rule_compare(3, op, n) == known_compare(n, {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op, op), 3)
        assert rule_compare(3, op, 5) == OPERATORS[op](3, 5)  # plain numbers: Python's answer
    assert known == []  # a pass records nothing
    with knowing_constraints(recorded):  # what the capture guarded, a pass re-running the rule may rely on
        assert rule_compare(n, op, m) == in_capture


def test_rule_same_shape_compares_like_tuples_and_never_reads_a_size_it_holds_twice():
    n, m = IntegerProxy(4, expr="x.shape[0]"), IntegerProxy(4, expr="y.shape[0]")
    computed = IntegerProxy(3)  # Tensor.item()'s result: reading it outside a capture raises
    with recording_constraints() as recorded:
        assert rule_same_shape((n, computed), (m, computed)) == ((4, 3) == (4, 3))
        assert rule_same_shape((n, 2), (n, 3)) == ((4, 2) == (4, 3))
        assert rule_same_shape((n,), (n, 1)) == ((4,) == (4, 1))
    # Only the symbolic sizes' equality was relied on: x and y of one size pass the guard, of two sizes not.
    assert _holds(recorded, 4, 4) and _holds(recorded, 6, 6) and not _holds(recorded, 4, 5)
    with knowing_constraints([]):
        assert not rule_same_shape((n, computed), (m, computed))  # equal only on the traced call


# Passes decide on their own; the VJP rules (vjp/, grad.py's use of them) are ops' rules, run under the split's
# recorder: they are checked with the ops' rules (rule_compare / rule_same_shape).
_RULE_MODULES = {"grad.py"}
# Functions of a pass whose sizes are plain ints (meta tensors standing for eager layouts).
_PLAIN_SIZES = {("overlap.py", "_status"), ("overlap.py", "_dense"), ("view_updates.py", "_places_repeat")}


def _pass_sources() -> list[Path]:
    root = ROOT / "minijit" / "transforms"
    return [p for p in sorted(root.rglob("*.py")) if "vjp" not in p.parts and p.name not in _RULE_MODULES]


# Calls whose result is no symbolic size, whatever sizes they are given.
_PLAIN_CALLS = {"len", "type", "number_value"}


def _mentions_sizes(node: ast.AST) -> bool:
    """Whether an operand reads a size (`.shape`, `.numel()`), other than through len() (or type(), number_value())."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _PLAIN_CALLS:
        return False
    if isinstance(node, ast.Attribute) and node.attr == "shape":
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("numel", "size"):
        return True
    return any(_mentions_sizes(child) for child in ast.iter_child_nodes(node))


def _size_comparisons(source: str, file: str = "") -> list[int]:
    """Lines of `source` comparing sizes with an operator (`==`, `<`, `in`, ...)."""
    tree = ast.parse(source)
    for f in ast.walk(tree):
        if isinstance(f, ast.FunctionDef) and (file, f.name) in _PLAIN_SIZES:
            f.body = []
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and not all(isinstance(o, ast.Is | ast.IsNot) for o in node.ops):
            if any(_mentions_sizes(x) for x in (node.left, *node.comparators)):
                lines.append(node.lineno)
        # max(), min() and sorted() compare with the operators too.
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ORDERING_CALLS:
            if any(_mentions_sizes(x) for x in node.args):
                lines.append(node.lineno)
    return lines


_ORDERING_CALLS = {"max", "min", "sorted"}


def _comparisons_in(paths: list[Path]) -> list[str]:
    """Each size compared with an operator in `paths`, as file:line: the line."""
    found = []
    for path in paths:
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}:{n}: {text.splitlines()[n - 1].strip()}"
                  for n in _size_comparisons(text, path.name)]
    return found


def test_passes_compare_sizes_only_through_the_explicit_functions():
    found = _comparisons_in(_pass_sources())
    assert not found, ("a pass compares sizes with an operator (call same_value / same_shape / known_compare):\n"
                       + "\n".join(found))


# The ops' modules that compare the layouts eager gives (torch tensors) with concrete sizes.
_EAGER_LAYOUTS = {"strides.py", "symbolic_strides.py", "iterator_layouts.py"}


def _op_sources() -> list[Path]:
    """The ops' rules: metas and decompositions (minijit/ops/), VJP rules (minijit/transforms/vjp/, grad.py)."""
    transforms = ROOT / "minijit" / "transforms"
    rules = [*sorted((transforms / "vjp").rglob("*.py")), *(transforms / name for name in sorted(_RULE_MODULES))]
    return [p for p in sorted((ROOT / "minijit" / "ops").rglob("*.py")) if p.name not in _EAGER_LAYOUTS] + rules


def test_op_rules_compare_sizes_only_through_the_explicit_functions():
    # An op's rules run in the capture and again where a pass records the op (functionalization, view
    # updates), where the operators raise: they compare sizes with rule_compare / rule_same_shape (so do
    # the VJP rules, for one way of comparing in every rule).
    # (A size already held in a variable is out of this check's sight: `n = x.shape[0]; n > 1`.)
    found = _comparisons_in(_op_sources())
    assert not found, ("an op's rule compares sizes with an operator (call rule_compare / rule_same_shape):\n"
                       + "\n".join(found))


def test_the_size_comparison_check_catches_what_it_is_for():
    bad = ["a.shape == b.shape", "x.shape[0] != 1", "if t.numel() < 2: pass", "tuple(a.shape) != (1, 2)",
           "d in x.shape", "1 == v.size(0)", "max(x.shape[0], 1)", "sorted(x.shape)", "numel_of(x.shape) == 0"]
    good = ["same_shape(a.shape, b.shape)", "len(a.shape) == 2", "a.ndim == b.ndim", "a.shape is b.shape",
            "not same_value(x.shape[0], 1)", "rule_compare(x.shape[0], '>', 1)", "type(x.shape[0]) is int",
            "number_value(x.shape[0]) == 1", "max(len(x.shape), 1)"]
    assert all(_size_comparisons(line) for line in bad)
    assert not any(_size_comparisons(line) for line in good)


@pytest.mark.parametrize("op", OPERATORS)
def test_a_comparison_operator_in_a_pass_replaying_captured_ops_raises(op):
    n, m = IntegerProxy(4, expr="x.shape[0]"), IntegerProxy(4, expr="y.shape[0]")
    with knowing_constraints([]), replaying_captured():
        with pytest.raises(UnguardedComparisonError, match="only a capture can guard"):
            OPERATORS[op](n, m)
        with pytest.raises(UnguardedComparisonError):
            OPERATORS[op](5, n)  # reflected


@pytest.mark.parametrize("op", OPERATORS)
@pytest.mark.parametrize("values", [(4, 4), (4, 5), (5, 4)])
def test_rule_compare_in_a_pass_replaying_captured_ops_decides_as_the_capture_did(op, values):
    n, m = IntegerProxy(values[0], expr="x.shape[0]"), IntegerProxy(values[1], expr="y.shape[0]")
    with recording_constraints() as recorded:
        in_capture = rule_compare(n, op, m), rule_compare(n, op, 5), rule_compare(5, op, m)
    # Sizes spelt otherwise but equal on the traced call (`x.shape[0]` and `y.shape[0]` after a functionalized
    # `x.copy_(y)`) are decided on the values, as the capture decided them: its guard keeps them true.
    for known in ([], recorded):
        with knowing_constraints(known), replaying_captured():
            replayed = rule_compare(n, op, m), rule_compare(n, op, 5), rule_compare(5, op, m)
        assert replayed == in_capture == (OPERATORS[op](*values), OPERATORS[op](values[0], 5),
                                          OPERATORS[op](5, values[1]))
        with knowing_constraints(known), replaying_captured():
            assert rule_same_shape((n, 2), (m, 2)) == ((values[0], 2) == (values[1], 2))
    assert known == recorded  # the replay recorded nothing
