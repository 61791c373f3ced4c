"""Op facts live on the symbol (`Effects`, `Tag`), never in a pass's list of op names.

A pass's table per symbol is keyed by the `Symbol` and checked for completeness when it
is built: a symbol declared with a fact but without its entry fails, naming the symbol.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import minijit
from minijit.errors import MinijitError
from minijit.ir import VIEWS_ANY_LAYOUT, VIEWS_IF_SPLITS, BoundSymbol, Effects, Symbol, Tag, TensorProxy, check_table
from minijit.ops import prims
from minijit.ops.eager_facts import write_facts
from minijit.ops.registry import ALL_LTORCH, check_eager_table
from minijit.transforms import view_updates
from minijit.transforms.memory import read_proxies
from minijit.transforms.view_updates import PRIM_SCATTER, check_view_tables

ROOT = Path(__file__).resolve().parents[2]


def _meta(x):
    return x


def test_the_declared_symbols_have_every_entry_their_facts_need():
    check_view_tables()  # as at import, on every prim and ltorch op declared by now


def test_a_view_prim_without_a_scatter_rule_is_named():
    throwaway = Symbol("throwaway_view", _meta, namespace="prims", is_prim=True, effects=Effects(views=0))
    with pytest.raises(MinijitError, match=r"no scatter rule .* for prims\.throwaway_view"):
        check_view_tables(prim_symbols=[*prims.ALL_PRIMS.values(), throwaway])


def test_a_prim_that_returns_its_argument_unchanged_needs_an_entry_too():
    throwaway = Symbol("throwaway_to", _meta, namespace="prims", is_prim=True,
                       effects=Effects(views=0, same_if_unchanged=True))
    with pytest.raises(MinijitError, match=r"prims\.throwaway_to"):
        check_view_tables(prim_symbols=[throwaway])


def test_a_layout_strict_view_without_a_layout_free_twin_is_named():
    throwaway = Symbol("throwaway_view", _meta, namespace="ltorch", effects=Effects(views=0),
                       tags=frozenset({Tag.LAYOUT_STRICT}))
    with pytest.raises(MinijitError, match=r"no layout-free twin .* for ltorch\.throwaway_view"):
        check_view_tables(ltorch_symbols=[*ALL_LTORCH.values(), throwaway])


def test_a_view_or_copy_by_shape_without_its_requested_shape_is_named():
    throwaway = Symbol("throwaway_reshape", _meta, namespace="ltorch",
                       effects=Effects(views=0, may_copy=True, reorders=True, view_layouts=VIEWS_IF_SPLITS))
    with pytest.raises(MinijitError, match=r"no requested shape .* for ltorch\.throwaway_reshape"):
        check_view_tables(ltorch_symbols=[throwaway])


def test_check_table_names_every_missing_symbol_and_accepts_a_complete_table():
    a = Symbol("a", _meta, namespace="test", tags=frozenset({"fact"}))
    b = Symbol("b", _meta, namespace="test", tags=frozenset({"fact"}))
    c = Symbol("c", _meta, namespace="test")
    with pytest.raises(MinijitError, match=r"no rule for test\.a, test\.b"):
        check_table({}, [a, b, c], lambda s: "fact" in s.tags, "rule")
    check_table({a: 1, b: None}, [a, b, c], lambda s: "fact" in s.tags, "rule")


def test_view_facts_need_a_view():
    with pytest.raises(ValueError, match="facts of a view"):
        Effects(reorders=True)
    with pytest.raises(ValueError, match="facts of a view"):
        Effects(views=0, same_if_unchanged=True, view_layouts=VIEWS_ANY_LAYOUT)
    with pytest.raises(ValueError, match="unknown view_layouts"):
        Effects(views=0, view_layouts="sometimes")


def test_scatter_rules_are_keyed_by_symbol():
    assert all(isinstance(k, Symbol) for k in PRIM_SCATTER)
    assert all(isinstance(k, Symbol) and isinstance(v, Symbol) for k, v in view_updates.LAYOUT_FREE.items())


def test_ltorch_in_place_ops_state_eager_s_overlap_facts():
    for sym in set(ALL_LTORCH.values()):
        facts = write_facts(sym.name)
        assert (sym.effects.refuses_overlap, sym.effects.reads_scalar_first) == \
            (facts["refuses_overlap"], facts["reads_scalar_first"]), sym


# Comparisons of an op's name, id or namespace, and lookups keyed by them: a pass asks the
# symbol's effects and tags instead (messages may print names: those are not matched).
_NAME_DECISION = re.compile(
    r"""sym\.(name|id|namespace)\s*(==|!=|\bin\b|\bnot\s+in\b)"""
    r"""|(==|!=|\bin\b)\s*sym\.(name|id)\b"""
    r"""|\.get\([^)]*\bsym\.(name|id)\s*[,)]"""
    r"""|\[\s*[\w.]*sym\.(name|id)\s*\]"""
    r"""|(==|!=)\s*["'](prims|ltorch|opaque|torch)\.\w+["']""")


def _sources() -> list[Path]:
    return [*(path for folder in ("minijit/transforms", "minijit/ops", "minijit/runtime", "executors")
              for path in sorted((ROOT / folder).rglob("*.py"))), ROOT / "minijit" / "ir" / "symbol.py"]


# Lines where a name is the right key, and why: not a decision about what the op does.
_NAME_IS_THE_KEY = {
    "minijit/runtime/execute.py: bound[sym.name] = impl.fn": "binds the names a printed trace calls (`prims.add`)",
}


def _matches(pattern: re.Pattern[str], paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    return found


def test_no_pass_decides_by_op_name():
    found = [f for f in _matches(_NAME_DECISION, _sources()) if _without_lineno(f) not in _NAME_IS_THE_KEY]
    assert not found, "decisions by op name (ask the symbol's Effects or Tag instead):\n" + "\n".join(found)


def _without_lineno(found: str) -> str:
    path, _, rest = found.partition(":")
    return f"{path}:{rest.partition(':')[2]}"


def test_the_allowed_names_are_still_there():
    found = {_without_lineno(f) for f in _matches(_NAME_DECISION, _sources())}
    assert set(_NAME_IS_THE_KEY) <= found  # an entry whose line is gone is dropped from the list


def test_the_name_check_catches_what_it_is_for():
    bad = ['if bsym.sym.name == "masked_fill_":', "if step.sym.name in _RESHAPES:",
           'rule = PRIM_SCATTER.get(bsym.sym.name)', 'if bsym.sym.id == "prims.full":',
           'if name == "prims.tensor_constant":', 'if bsym.sym.namespace != "ltorch":']
    good = ['raise MinijitError(f"{bsym.sym.id}: cannot")', 'if Tag.CAST in bsym.sym.tags:',
            'rule = PRIM_SCATTER.get(bsym.sym)']
    assert all(_NAME_DECISION.search(line) for line in bad)
    assert not any(_NAME_DECISION.search(line) for line in good)


# The keyword `out` spelled in a pass: which arguments an op only writes is `Effects.unread`, and which
# one an executor's `out=` form writes its result into is `Effects.result_into`.
_OUT_BY_NAME = re.compile(r"""["']out["']""")


# Files where `out` is torch's own keyword: the torch calls a user makes with `out=` (opaque.py, values.py, and
# eager_errors.py asking eager about them), the `out=` forms the torch executor makes, and the declarations of the
# prims that take one and of `Effects`.
_OUT_IS_TORCH_S_KEYWORD = {"minijit/ops/opaque.py", "minijit/runtime/values.py", "minijit/ops/eager_errors.py",
                           "executors/torch.py",
                           "executors/torch_foreach.py",
                           "minijit/ops/prims.py", "minijit/ir/symbol.py"}


def test_no_pass_looks_up_the_out_keyword_by_name():
    passes = [p for p in _sources() if str(p.relative_to(ROOT)) not in _OUT_IS_TORCH_S_KEYWORD]
    found = _matches(_OUT_BY_NAME, passes)
    assert not found, "`out` looked up by name (ask Effects.unread / result_into instead):\n" + "\n".join(found)


def test_an_ltorch_op_without_an_eager_callable_is_named():
    check_eager_table()  # as at import, on every ltorch op declared by now
    throwaway = Symbol("throwaway_op", _meta, namespace="ltorch")
    with pytest.raises(MinijitError, match=r"no eager implementation .* for ltorch\.throwaway_op"):
        check_eager_table([*ALL_LTORCH.values(), throwaway])


def test_reads_leave_out_what_the_symbol_declares_unread():
    a, b, dest = (TensorProxy((2,), torch.float32, torch.device("cpu"), name=n) for n in ("a", "b", "dest"))
    call = prims.copy_to_out_.bind(a, out=dest, output=dest)
    assert [p.name for p in read_proxies(call)] == ["a"]  # copy_to_out_ declares its `out` unread
    reading = Symbol("reads_out", _meta, namespace="test", is_prim=True, effects=Effects(writes=("out",)))
    assert [p.name for p in read_proxies(BoundSymbol(reading, (a, b), {"out": dest}, dest))] == ["a", "b", "dest"]
    assert [p.name for p in read_proxies(prims.copy_.bind(a, b, output=b))] == ["a", "b"]


def test_an_executor_s_out_form_declares_its_out_written_unread_and_holding_the_result():
    from minijit.extend import get_executor

    def f(x, y):
        return x + y

    jf = minijit.jit(f)
    jf(torch.randn(3), torch.randn(3))
    final = minijit.last_traces(jf)[-1]
    (producer,) = final.bound_symbols
    x, y = final.args
    into = get_executor("torch").produce_into(producer, y)  # `torch.add(x, y, out=y)`
    assert (into.sym.effects.writes, into.sym.effects.unread, into.sym.effects.result_into) == (("out",), ("out",), "out")
    assert into.written() == [y] and [p.name for p in read_proxies(into)] == [x.name, y.name]
