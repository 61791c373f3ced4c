"""Checks of values read from outside that an entry's guard makes together (runtime/checks.py `Prologue`).

A model's guard reads hundreds of values from dicts: each module's `__dict__` (`_parameters`, `_modules`, its hook
dicts, `forward`), its `_parameters` dict, an optimizer's `state` and each parameter's state dict. Two ways to make
such checks at less cost, each giving the same answer as the checks one by one:

- a test implied by another is left out: `key in d` is True where the guard reads `d[key]` (a plain dict) and
  finds a value (nn.Module's `__getattr__` asks both);
- the checks that read one dict are made once per change of that dict: CPython gives every dict a version that
  takes a new value, never used before by any dict, on each change of its contents (what its specialised global
  loads rely on; torch reads it for Dynamo's guards). A group of checks reading one dict passes at once where the
  dict's version is one it had when the whole group last passed; else the group's checks run, and the version is
  kept where they pass. Only checks whose answer follows from the dict's contents alone join: a value compared by
  identity, by type, or by equality where it is an immutable constant; membership, length, and the keys' order
  of a dict or defaultdict (an OrderedDict reorders without a change of version). The version is CPython's own
  (`ma_version_tag`, PEP 509) only on Python 3.11: from 3.12 torch counts the events of a dict watcher it attaches
  instead, which some changes of an instance's attributes do not send (3.12.1: a test here saw an attribute change
  with no new version), and 3.13 keeps instance attributes outside the dict object. So groups are made on 3.11
  only, after a probe (`DICT_VERSIONS`); elsewhere every check runs on every call, as before.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from minijit.frontend.guards import MISSING, Source, has_snapshot, own_dict, read_form

if TYPE_CHECKING:
    from minijit.runtime.checks import Check

# The dict types whose membership, length and items follow from their contents alone.
_VERSIONED = (dict, collections.defaultdict, collections.OrderedDict)
# The local a group's test keeps the version it read in (a name no trace input takes, as checks.py's `_READ`).
_VERSION = "_minijit_version"
# The environment's list of the last version each group passed with.
SEEN = "_dict_versions"


def _find_dict_version() -> Any:
    """torch's reader of a dict's version where it reads CPython's own (Python 3.11) and, probed, this Python's dicts
    take a new version on every change of an instance's attributes and of a dict's items; else None."""
    if sys.version_info[:2] != (3, 11):
        return None
    try:
        from torch._C._dynamo.guards import dict_version
    except ImportError:
        return None

    class Probe:
        pass

    probe = Probe()
    probe.a = 1
    instance, plain = probe.__dict__, {"a": 1}
    for change in (lambda: setattr(probe, "a", 2), lambda: setattr(probe, "b", 1), lambda: plain.update(a=2),
                   lambda: plain.pop("a")):
        before = (dict_version(instance), dict_version(plain))
        change()
        if before == (dict_version(instance), dict_version(plain)):
            return None
    return dict_version


DICT_VERSIONS = _find_dict_version()


def saw_version(seen: list[Any], group: int, version: int, mapping: Any) -> bool:
    """Keep `version` as one that `group`'s dict `mapping` passed with (where its contents alone decide); True."""
    if type(mapping) in _VERSIONED:
        seen[group] = version
    return True


def read_groups(checks: Sequence[Check], tests: dict[int, str], env: dict[str, Any]) -> list[tuple[str, set[int]]]:
    """Tests that make several of `checks` at once (their tests by id in `tests`), and the ids of those each makes:
    ("", ids) for the tests left out as implied, then one test per dict read by two or more checks."""
    implied = _implied_memberships(checks)
    found = [("", implied)] if implied else []
    if DICT_VERSIONS is None:
        return found
    groups: dict[tuple[str, int], list[tuple[Check, str]]] = {}
    for c in checks:
        where = None if id(c) in implied else _dict_read(c)
        if where is not None:
            groups.setdefault(where[:2], []).append((c, where[2]))
    made = [members for members in groups.values() if len(members) > 1]
    if not made:
        return found
    env[SEEN] = [None] * len(made)
    env["_dict_version"], env["_saw_version"] = DICT_VERSIONS, saw_version
    for j, members in enumerate(made):
        mapping = members[0][1]
        each = " and ".join(tests[id(c)] for c, _ in members)
        test = (f"(({_VERSION} := _dict_version({mapping})) == {SEEN}[{j}] or (({each}) and "
                f"_saw_version({SEEN}, {j}, {_VERSION}, {mapping})))")
        found.append((test, {id(c) for c, _ in members}))
    return found


def _dict_read(c: Check) -> tuple[str, int, str] | None:
    """(the kind of dict, the id of the object read, the source of the dict) of a check whose answer follows from
    one dict's contents alone, else None."""
    g = c.read
    if g is None or c.keyed or c.at is None or g.shadow is not None or isinstance(g.namespace, Source):
        return None
    ns, kind = g.namespace, g.kind
    if kind not in ("contains", "length", "keys") and (g.contents is not None or has_snapshot(g.value)):
        return None  # compared with a copy of a list or dict it holds, which may change within the dict
    if kind == "attribute":
        form = read_form(g)
        if form not in ("attribute", "own dict"):
            return None
        instance = getattr(ns, "__dict__", None) if form == "attribute" else own_dict(ns)
        if type(instance) is not dict or (form == "attribute" and instance is not own_dict(ns)):
            return None
        source = f"_ns{c.at}.__dict__" if form == "attribute" else f"_own_dict(_ns{c.at})"
        return form, id(ns), source
    if kind == "keys" and type(ns) not in (dict, collections.defaultdict):
        return None  # (an OrderedDict's order changes with no new version: `move_to_end`)
    if type(ns) not in _VERSIONED or (kind not in ("contains", "length", "keys") and read_form(g) != "dict get"):
        return None
    return "dict", id(ns), f"_ns{c.at}"


def _implied_memberships(checks: Sequence[Check]) -> set[int]:
    """The ids of the checks that `key in d` is True where another check reads `d[key]` (a plain dict) and finds a
    value: implied, left out of the guard. A rebind pairs objects one to one, so names bound to one object stay
    bound to one object."""
    present = {(id(c.read.namespace), c.read.name) for c in checks
               if c.read is not None and not c.keyed and not isinstance(c.read.namespace, Source)
               and c.read.kind not in ("contains", "length", "keys") and read_form(c.read) == "dict get"
               and c.read.value is not MISSING and _hashable(c.read.name)}
    return {id(c) for c in checks if c.read is not None and not c.keyed and c.read.kind == "contains"
            and c.read.value is True and type(c.read.namespace) is dict and _hashable(c.read.name)
            and (id(c.read.namespace), c.read.name) in present}


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True
