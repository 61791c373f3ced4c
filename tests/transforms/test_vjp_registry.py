"""One way to register a gradient: one table keyed by symbol, checked when a rule is registered."""

from __future__ import annotations

import pytest
import torch

import minijit
from minijit.errors import RegistrationError
from minijit.extend import Executor, FusionExecutor, OperatorExecutor
from minijit.ir import Symbol
from minijit.ops.registry import ALL_LTORCH
from minijit.transforms.vjp import VJP_RULES, vjp


def _composite(name: str) -> Symbol:
    def meta(input, dim, keepdim=False):
        return input

    return Symbol(name, meta, namespace="test")


def test_a_rule_for_a_name_that_is_no_symbol_fails_at_registration():
    with pytest.raises(RegistrationError, match=r"'ltorch\.no_such_op'.*no symbol"):
        @vjp("ltorch.no_such_op")
        def forward(a):
            return a, ()


def test_a_rule_with_other_parameter_names_fails_at_registration():
    sym = _composite("mean_like")
    with pytest.raises(RegistrationError, match=r"forward for test\.mean_like takes \(x, axis, keepdim\).*"
                                                r"\(input, dim, keepdim\)"):
        @vjp(sym)
        def forward(x, axis, keepdim=False):
            return sym(x, axis, keepdim), ()
    assert sym not in VJP_RULES
    # With the symbol's names (the first parameter may be called anything) it registers.
    rule = vjp(sym)(lambda x, dim, keepdim=False: (sym(x, dim, keepdim), ()))
    assert VJP_RULES[sym] is rule


def test_a_second_rule_for_a_symbol_fails_at_registration():
    softmax = ALL_LTORCH["softmax"]
    assert softmax in VJP_RULES
    with pytest.raises(RegistrationError, match=r"ltorch\.softmax is registered twice"):
        vjp(softmax)(VJP_RULES[softmax].forward)


def test_an_executor_grad_transform_with_other_parameter_names_fails_at_registration():
    ex = OperatorExecutor("badgradex")
    with pytest.raises(RegistrationError, match=r"grad_transform of executor badgradex.*ltorch\.softmax"):
        ex.register_implementation(torch.softmax, torch.softmax,
                                   grad_transform=(lambda a, axis, dtype=None: None, lambda saved, g: (g,)))
    assert not ex.implementations  # refused whole: the executor does not claim softmax


def test_executors_answer_the_base_api():
    base, fuser = Executor("plainex"), FusionExecutor("fuserex")
    assert (base.fuses_regions, fuser.fuses_regions, OperatorExecutor("opex").fuses_regions) == (False, True, False)


class _Helpful(OperatorExecutor):
    """An operator executor with methods that happen to be named like a fusion executor's."""

    def fuse(self, things):
        return list(things)

    def claims(self, bsym):
        return True


def test_an_operator_executor_is_never_taken_for_a_fusion_executor_by_its_method_names():
    ex = _Helpful("helpfulex")
    ex.register_implementation(torch.sin, torch.sin)
    jf = minijit.jit(lambda a: a.sin() * 2, executors=[ex])
    a = torch.randn(4)
    torch.testing.assert_close(jf(a), a.sin() * 2)
    assert "helpfulex.sin" in minijit.last_traces(jf)[-1].python()
