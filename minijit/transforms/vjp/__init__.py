"""VJP rules, one registration style (`@vjp(sym)` + `@rule.backward`), grouped by op family."""

from minijit.transforms.vjp import aten_prims, elementwise, nn, opaque, structural  # noqa: F401 - registers the rules
from minijit.transforms.vjp.registry import VJP_RULES, KeywordGrads, VjpRule, add_rule, rule_for, vjp

__all__ = ["VJP_RULES", "KeywordGrads", "VjpRule", "add_rule", "rule_for", "vjp"]
