"""Numbers read from outside the call that change between calls go symbolic (minijit.runtime.dynamic, DynamicNumbers):
an lr schedule, Adam's betas, a counter attribute. Every result is compared with an eager copy run side by side."""

import copy
import math

import pytest
import torch

import minijit
from minijit.testing import tolerance

TOL = tolerance(torch.float32, reduction_length=8)


def _assert_same_state(opt, eager_opt):
    for group, eager_group in zip(opt.param_groups, eager_opt.param_groups, strict=True):
        for p, q in zip(group["params"], eager_group["params"], strict=True):
            torch.testing.assert_close(p, q, **TOL)
            state, eager_state = opt.state[p], eager_opt.state[q]
            assert state.keys() == eager_state.keys()
            for k in state:
                torch.testing.assert_close(state[k], eager_state[k], **TOL)


def _train(make_opt, schedule, steps, cache="automatic"):
    """`steps` steps of a jitted `opt.step` and of an eager copy, `schedule(i, group)` changing each group before
    step i; returns the jitted step's cache info (the states are compared after every step)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    eager_model = copy.deepcopy(model)
    opt, eager_opt = make_opt(model.parameters()), make_opt(eager_model.parameters())
    step = minijit.jit(opt.step, cache=cache)
    for i in range(steps):
        for o in (opt, eager_opt):
            for group in o.param_groups:
                schedule(i, group)
        x = torch.randn(4, 8)
        model(x).square().sum().backward()
        eager_model(x).square().sum().backward()
        step()
        eager_opt.step()
        opt.zero_grad()
        eager_opt.zero_grad()
        _assert_same_state(opt, eager_opt)
    return minijit.cache_info(step)


def _cosine(i, group):
    group["lr"] = 1e-2 * (1 + math.cos(math.pi * i / 100)) / 2 + 1e-4


def _everything(i, group):
    _cosine(i, group)
    if "betas" in group:
        group["betas"] = (0.9 - 0.001 * i, 0.999 - 0.0001 * i)
    if "momentum" in group:
        group["momentum"] = 0.9 - 0.001 * i
    group["weight_decay"] = 0.01 + 0.0001 * i


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.01),
    lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=0.01),
], ids=["AdamW", "Adam", "SGD-momentum"])
def test_lr_betas_and_weight_decay_changing_every_step_trace_twice(make_opt):
    info = _train(make_opt, _everything, 100)
    assert info.misses <= 2, info
    assert any("lr" in d for d in info.dynamic)


def test_the_lr_loop_of_the_issue():
    """lr changes from the second step on: the state's first step, the steady step, then lr goes symbolic."""
    def schedule(i, group):
        group["lr"] = 1e-2 * (1 + math.cos(max(i - 1, 0) / 10)) / 2

    info = _train(lambda ps: torch.optim.AdamW(ps, lr=1e-2), schedule, 10)
    assert info.misses == 3, info
    assert any(d.startswith("number made symbolic: item ['lr'] of param_groups_0 changed 0.01 -> 0.0099")
               for d in info.dynamic), info.dynamic


def test_symbolic_values_makes_outside_numbers_symbolic_too():
    info = _train(lambda ps: torch.optim.AdamW(ps, lr=1e-2), _everything, 20, cache="symbolic values")
    assert info.misses <= 2, info


def test_constant_values_keeps_numbers_constant():
    info = _train(lambda ps: torch.optim.AdamW(ps, lr=1e-2), _cosine, 5, cache="constant values")
    assert info.misses == 5 and not info.dynamic


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n = 0

    def forward(self, x):
        self.n += 1
        return x * self.n


class Window:
    def __init__(self):
        self.n = 1

    def take(self, x):
        self.n += 1
        return x[: self.n].sum(0)


def test_a_counter_attribute_traces_twice():
    jitted, eager = Counter(), Counter()
    step = minijit.jit(jitted.forward)
    x = torch.randn(3)
    for _ in range(10):
        torch.testing.assert_close(step(x), eager(x))
        assert type(jitted.n) is int and jitted.n == eager.n
    info = minijit.cache_info(step)
    assert info.misses <= 2 and any("attribute n" in d for d in info.dynamic)


def test_a_counter_used_as_a_slice_bound_traces_twice():
    jitted, eager = Window(), Window()
    take = minijit.jit(jitted.take)
    x = torch.randn(12, 3)
    for _ in range(10):
        torch.testing.assert_close(take(x), eager.take(x))
        assert jitted.n == eager.n
    assert minijit.cache_info(take).misses <= 2


SCALE = 2.0


def _scaled(x):
    if SCALE > 1:  # a branch on the symbolic number: guarded
        return x * SCALE
    return x - SCALE


def test_a_value_that_flips_a_branch_is_traced_again():
    global SCALE
    jf = minijit.jit(_scaled)
    x = torch.randn(4)
    try:
        for value in (2.0, 3.0, 4.0, 0.5, 0.25, 5.0):
            SCALE = value
            torch.testing.assert_close(jf(x), _scaled(x))
    finally:
        SCALE = 2.0
    info = minijit.cache_info(jf)
    assert info.misses == 3, info  # 2.0; 3.0 goes symbolic (SCALE > 1); 0.5 fails that constraint
    assert any("global SCALE changed 2.0 -> 3.0" in d for d in info.dynamic)


def test_bools_and_type_changes_stay_guarded():
    class Config:
        flag = True
        factor = 2

    cfg = Config()
    cfg.flag, cfg.factor = True, 2

    def f(x):
        return x * cfg.factor if cfg.flag else x + cfg.factor

    def eager(x):
        return x * cfg.factor if cfg.flag else x + cfg.factor

    jf = minijit.jit(f)
    x = torch.randn(4)
    for flag, factor in [(True, 2), (True, 3), (True, 4), (False, 4), (True, 5), (True, 2.5), (False, 1.5)]:
        cfg.flag, cfg.factor = flag, factor
        out = jf(x)
        torch.testing.assert_close(out, eager(x))
    info = minijit.cache_info(jf)
    assert not any("flag" in d for d in info.dynamic)
    assert any("attribute factor" in d for d in info.dynamic)


def test_a_closure_number_goes_symbolic():
    decay = 0.9

    def ema(avg, x):
        return avg * decay + x * (1 - decay)

    jf = minijit.jit(ema)
    avg, x = torch.zeros(5), torch.randn(5)
    for value in (0.9, 0.99, 0.999, 0.95, 0.5):
        decay = value
        torch.testing.assert_close(jf(avg, x), ema(avg, x))
    info = minijit.cache_info(jf)
    assert info.misses == 2 and any("closure variable decay" in d for d in info.dynamic)


def test_the_dynamic_sources_are_bounded(monkeypatch):
    import minijit.runtime.dynamic as dynamic
    from minijit.frontend.guards import GuardEntry

    monkeypatch.setattr(dynamic, "MAX_SOURCES", 3)
    numbers = dynamic.DynamicNumbers()
    holders = [{"k": 1.0} for _ in range(6)]
    for holder in holders:
        assert numbers.made_dynamic([(GuardEntry("item", holder, "k", 1.0), 2.0)])
    assert len(numbers.sources) == 3
    assert [numbers.covers("item", h, "k") for h in holders] == [False] * 3 + [True] * 3
    # An unchanged value, a bool and a string are never made dynamic.
    other = {"a": 1.0, "b": True, "c": "x"}
    assert not numbers.made_dynamic([(GuardEntry("item", other, "a", 1.0), 1.0),
                                     (GuardEntry("item", other, "b", True), False),
                                     (GuardEntry("item", other, "c", "x"), "y")])


@pytest.mark.parametrize("make_schedule", [
    lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50),
    lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=60),  # betas cycle too
], ids=["CosineAnnealingLR", "OneCycleLR"])
def test_a_real_lr_scheduler_traces_twice(make_schedule):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    eager_model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    schedule, eager_schedule = make_schedule(opt), make_schedule(eager_opt)
    step = minijit.jit(opt.step)  # the scheduler wraps it: it reaches `opt` through a weakref
    for _ in range(40):
        x = torch.randn(4, 8)
        # A loss linear in the parameters: the gradients do not carry the last step's rounding into the next.
        model(x).sum().backward()
        eager_model(x).sum().backward()
        step()
        eager_opt.step()
        schedule.step()
        eager_schedule.step()
        opt.zero_grad()
        eager_opt.zero_grad()
        _assert_same_state(opt, eager_opt)
    info = minijit.cache_info(step)
    assert info.misses <= 2, info


def test_tensor_betas_raised_to_the_step_count_trace_twice():
    """With tensor betas the for-loop Adam computes `beta1 ** step`, a tensor to the power of the step count read
    as a number (`_get_value`): the exponent is not compared with 2 (a guard on its value: a trace per step)."""
    def make_opt(ps):
        return torch.optim.AdamW(ps, lr=torch.tensor(1e-2), betas=(torch.tensor(0.9), torch.tensor(0.999)),
                                 foreach=False)

    info = _train(make_opt, _cosine, 5)
    assert info.misses <= 2, info


def test_a_symbolic_int_the_code_needs_as_a_python_int_is_guarded_by_value():
    class Steps:
        n = 1

    steps = Steps()
    steps.n = 1

    def f(x):
        for _ in range(steps.n):  # range() needs the int itself: the trace relies on its value
            x = x * 2
        return x

    jf = minijit.jit(f)
    x = torch.randn(3)
    for n in (1, 2, 3, 2, 4):
        steps.n = n
        torch.testing.assert_close(jf(x), x * 2 ** n)


def test_a_tuple_of_numbers_that_changes_length_is_traced_again():
    class Polynomial:
        coefficients = ()

    holder = Polynomial()

    def f(x):
        out = x * 0
        for i, c in enumerate(holder.coefficients):
            out = out + c * x ** i
        return out

    jf = minijit.jit(f)
    x = torch.randn(4)
    for coefficients in [(1.0, 2.0), (0.5, 3.0), (2.0, 1.0), (1.0, 2.0, 3.0), (0.0, 1.0, 0.5), (1, 2)]:
        holder.coefficients = coefficients
        torch.testing.assert_close(jf(x), f(x))
    info = minijit.cache_info(jf)
    assert any("attribute coefficients" in d for d in info.dynamic)


@pytest.mark.parametrize("special", [math.inf, -math.inf, math.nan])
def test_an_infinite_or_nan_number_the_trace_relies_on_is_guarded_by_valid_source(special):
    # math.sqrt needs the float itself: the trace guards `abs(lst_1) == <value>`; `inf` and `nan` are no Python names.
    def f(x, lst):
        return x * 2, math.sqrt(abs(lst[1]))

    jf = minijit.jit(f)
    x = torch.randn(3)
    for value in (0.5, 0.75, special, special, 0.25):
        have, want = jf(x, [1, value]), f(x, [1, value])
        torch.testing.assert_close(have[0], want[0])
        assert repr(have[1]) == repr(want[1])


def _outcomes(f, jf, *args):
    """(eager's, jit's) result as a list, or 'raised' (any exception) for each."""
    out = []
    for fn in (f, jf):
        try:
            out.append(fn(*args).tolist())
        except Exception:
            out.append("raised")
    return tuple(out)


@pytest.mark.parametrize("values", [(2.0,), (3.0, 2.0), (2.5, 2.0)])
def test_a_float_equal_to_an_int_is_no_narrow_bound_as_in_eager(values):
    # min(2.0, 2) is the float 2.0, which torch.narrow refuses: symbolic or not, it is not read as the int 2.
    class Holder:
        k = 0.0

    holder = Holder()

    def f(x):
        return x.narrow(0, 0, min(holder.k, 2)) * 2  # (all of x: a narrow that changes nothing)

    jf = minijit.jit(f)
    x = torch.randn(2, 3)
    for k in values:
        holder.k = k
        eager, jit = _outcomes(f, jf, x)
        assert jit == eager, (k, minijit.cache_info(jf))


@pytest.mark.parametrize("values", [(True,), (False,), (2, True), (2, 3, 2.0), (2, 3, False)])
@pytest.mark.parametrize("op", ["expand", "roll"])
def test_a_bool_or_float_is_no_expand_size_or_roll_shift_as_in_eager(values, op):
    def f(x, n):
        return x[:1].expand(n, 3) * 2 if op == "expand" else (x * 2).roll(n, 0).roll(n, 0)

    jf = minijit.jit(f)
    x = torch.randn(4, 3)
    for n in values:
        eager, jit = _outcomes(f, jf, x, n)
        assert jit == eager, (n, minijit.cache_info(jf))


def test_round_of_a_symbolic_number_is_eagers():
    # round() of a number made symbolic raised TypeError while traced (no __round__): the call ran eagerly.
    class Holder:
        k, n = 0.0, 0

    holder = Holder()

    def f(x):
        return x * 2, round(holder.k), round(holder.k, 1), round(holder.n), round(holder.n, -1), round(holder.k + 1)

    jf = minijit.jit(f)
    x = torch.randn(3)
    for k, n in [(2.5, 3), (3.5, 4), (0.25, 15), (-2.5, -25), (2.75, 7)]:
        holder.k, holder.n = k, n
        have, want = jf(x), f(x)
        torch.testing.assert_close(have[0], want[0])
        assert repr(have[1:]) == repr(want[1:])
    assert minijit.cache_info(jf).eager_calls == 0


def test_a_symbolic_float_compared_with_itself_is_false_for_nan():
    # `k != k` (a nan check) was decided True-for-every-value on a symbolic float, and `k == k` left unguarded.
    class Holder:
        k = 0.0

    holder = Holder()

    def f(x):
        return x * 2, (2 if holder.k != holder.k else 1), holder.k == holder.k, abs(holder.k) < abs(holder.k)

    jf = minijit.jit(f)
    x = torch.randn(3)
    for k in (0.5, 0.75, math.nan, 0.25, math.nan, math.inf):
        holder.k = k
        have, want = jf(x), f(x)
        torch.testing.assert_close(have[0], want[0])
        assert have[1:] == want[1:], (k, minijit.cache_info(jf))


@pytest.mark.parametrize("cache", ["automatic", "constant values", "symbolic values"])
def test_minus_zero_is_not_the_entry_of_zero(cache):
    """0.0 and -0.0 are one value to `==` (and to a dict's key): the cache key, the value guards and the constraints
    also tell the sign of a float zero, so a call with -0.0 does not reuse the entry traced for 0.0."""
    class Holder:
        k = 0.0

    holder = Holder()

    def f(x, k):
        return x * 2, math.copysign(1.0, k), math.copysign(1.0, holder.k), torch.full((1,), k)

    jf = minijit.jit(f, cache=cache)
    x = torch.randn(3)
    for k in (1.0, 2.0, 0.0, -0.0, 0.0, -0.0, 3.0):
        holder.k = k
        have, want = jf(x, k), f(x, k)
        assert have[1:3] == want[1:3], (k, have, want)
        assert torch.equal(torch.signbit(have[3]), torch.signbit(want[3]))


@pytest.mark.parametrize("dim", [True, False, 1.0])
@pytest.mark.parametrize("op", ["transpose", "squeeze", "flatten", "softmax", "cumsum", "unsqueeze"])
def test_a_bool_or_float_is_no_dim_as_in_eager(op, dim):
    """Eager's argument parser refuses a bool or a float where an op takes a dim; minijit took True for dim 1 (a
    value where eager raises)."""
    calls = {"transpose": lambda x, d: x.transpose(d, 1), "squeeze": lambda x, d: x.squeeze(d),
             "flatten": lambda x, d: x.flatten(d), "softmax": lambda x, d: x.softmax(d),
             "cumsum": lambda x, d: x.cumsum(d), "unsqueeze": lambda x, d: x.unsqueeze(d)}
    fn = calls[op]
    x = torch.randn(4, 1, 3)
    eager, jit = _outcomes(fn, minijit.jit(fn), x, dim)
    assert jit == eager


_INT_ARGUMENTS = {
    "topk": lambda x, v: x.topk(v), "chunk": lambda x, v: x.chunk(v), "split": lambda x, v: x.split(v),
    "split_sizes": lambda x, v: x.split([v, 2]), "repeat": lambda x, v: x.repeat(v, 1),
    "tile": lambda x, v: x.tile((v, 1)), "select": lambda x, v: x.select(0, v), "diagonal": lambda x, v: x.diagonal(v),
    "tril": lambda x, v: x.tril(v), "triu": lambda x, v: x.triu(v), "narrow": lambda x, v: x.narrow(0, 0, v),
}


@pytest.mark.parametrize("value", [2.0, True])
@pytest.mark.parametrize("op", list(_INT_ARGUMENTS))
def test_a_bool_or_float_int_argument_raises_as_in_eager_even_where_the_result_is_unused(op, value):
    """Eager's argument parser refuses a float or a bool where an op takes an int (`x.topk(2.0)`). Where minijit took
    it, an unused result was dropped from the trace and the call returned a value where eager raises."""
    def f(x, v):
        _INT_ARGUMENTS[op](x, v)
        return x * 2

    eager, jit = _outcomes(f, minijit.jit(f), torch.randn(4, 6), value)
    assert jit == eager


def test_a_symbolic_number_not_in_a_dict_or_set_is_guarded_against_each_key():
    """`n in {2, 5}` on a counter gone symbolic: a lookup that finds no key compares nothing, so the outcome is
    decided by comparing with each key (n != 2, n != 5, guarded), not by the hash of the value seen; a lookup that
    hashes a symbolic number natively (`dict.get`) relies on the value: a trace per value, as right as eager."""
    from collections import Counter

    class Stepper:
        def __init__(self):
            self.epoch, self.scale, self.milestones = 0, 1.0, Counter([2, 5, 5, 9])

        def step(self):
            self.epoch += 1
            hit = self.epoch in {5: "a", 9: "b"}, {3: 0.1, 7: 0.2}.get(self.epoch, 1.0)  # dict.get hashes natively
            if self.epoch not in self.milestones:
                return self.scale, hit
            self.scale = self.scale * 0.5 ** self.milestones[self.epoch]
            return self.scale, hit

    eager, traced = Stepper(), Stepper()
    step = minijit.jit(traced.step)
    for _ in range(12):
        assert step() == eager.step()
    assert minijit.cache_info(step).misses <= 12, minijit.cache_info(step)


def _stepped_inside(make_schedule, steps):
    """SGD with momentum and `make_schedule(opt)` stepped inside one jitted step, `steps` times, and the same eagerly:
    (the eager lrs and parameters, the jitted ones, the jitted step)."""
    runs = []
    for use_jit in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        schedule = make_schedule(opt)

        def step(opt=opt, schedule=schedule):
            opt.step()
            schedule.step()

        jitted = minijit.jit(step) if use_jit else step
        lrs = []
        for i in range(steps):
            model(torch.ones(3, 4) * (i % 5)).sum().backward()
            jitted()
            opt.zero_grad()
            lrs.append(opt.param_groups[0]["lr"])
        runs.append((lrs, [p.detach() for p in model.parameters()], jitted))
    (want_lrs, want, _), (have_lrs, have, jitted) = runs
    for w, h in zip(want, have, strict=True):
        torch.testing.assert_close(h, w, **TOL)
    return want_lrs, have_lrs, jitted


def test_the_multistep_lr_scheduler_stepped_inside_the_jitted_step_matches_eager():
    """MultiStepLR asks `last_epoch not in milestones` (a Counter) on every step: the lr drops at each milestone."""
    want_lrs, have_lrs, _ = _stepped_inside(lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [2, 5, 9], gamma=0.3),
                                            12)
    assert have_lrs == want_lrs


@pytest.mark.parametrize("make_schedule", [
    lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20),
    lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=40),
    lambda opt: torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=4),
    lambda opt: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=5, T_mult=2),
    lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / 30))),
], ids=["CosineAnnealingLR", "OneCycleLR", "CyclicLR", "CosineAnnealingWarmRestarts", "LambdaLR-cosine"])
def test_a_scheduler_computing_with_math_stepped_inside_the_jitted_step_traces_a_few_times(make_schedule):
    """`math.cos(math.pi * epoch / T)`, `math.floor`, `int()` and `float()` of the schedule's numbers are computed by
    each call (number prims), not fixed to the traced epoch's value: a trace per phase, not one per step."""
    want_lrs, have_lrs, jitted = _stepped_inside(make_schedule, 24)
    for h, w in zip(have_lrs, want_lrs, strict=True):
        assert h == pytest.approx(w, rel=1e-12, abs=1e-15)
    info = minijit.cache_info(jitted)
    assert info.misses <= 5, info


@pytest.mark.parametrize("op", ["cos", "exp", "log", "sqrt", "floor", "ceil", "trunc", "atan2", "pow", "int", "float"])
def test_math_functions_and_conversions_of_symbolic_numbers_are_computed_by_each_call(op):
    fn = {"int": int, "float": float}.get(op) or getattr(math, op)

    def f(x, n, g):
        if op in ("atan2", "pow"):
            return x * fn(g, n) + fn(n, 2)
        return x * fn(g) + fn(n)

    jf = minijit.jit(f)
    for n, g in [(1, 0.5), (2, 1.5), (3, 2.25), (7, 0.125), (4, 9.0)]:
        x = torch.ones(3)
        torch.testing.assert_close(jf(x, n, g), f(x, n, g), rtol=1e-6, atol=0)
    assert minijit.cache_info(jf).misses <= 2, minijit.cache_info(jf)


def test_a_math_domain_error_is_eagers_on_every_call():
    def f(x, g):
        return x * math.sqrt(g)

    jf = minijit.jit(f)
    for g in (1.0, 4.0, -1.0, 9.0, -4.0):
        try:
            want = f(torch.ones(2), g)
        except ValueError as e:
            with pytest.raises(ValueError, match=str(e)):
                jf(torch.ones(2), g)
        else:
            torch.testing.assert_close(jf(torch.ones(2), g), want)


def test_methods_of_a_symbolic_float_are_the_values():
    def f(x, g):
        return x * g, float(g).is_integer(), g.as_integer_ratio()

    jf = minijit.jit(f)
    for g in (0.5, 1.5, 2.0, 3.0):
        assert jf(torch.ones(2), g)[1:] == f(torch.ones(2), g)[1:]
    assert minijit.cache_info(jf).eager_calls == 0  # traced, not run eagerly after the trace failed


def test_an_expand_size_of_minus_one_from_an_int_argument_keeps_the_dim_as_in_eager():
    # A symbolic -1 keeps the dim's size, relied on (a constraint); before, the symbolic trace was refused and each
    # value traced again with constants.
    def f(x, n, m):
        return x.expand(n, m) * 2

    jf = minijit.jit(f)
    x = torch.ones(1, 3)
    for n, m in [(4, 3), (2, -1), (5, -1), (-1, 3), (-1, -1), (3, 3)]:
        torch.testing.assert_close(jf(x, n, m), f(x, n, m))
    info = minijit.cache_info(jf)
    assert info.hits >= 2 and not any("refused" in r for r in info.miss_reasons), info


def test_arithmetic_on_a_symbolic_int_keeps_eagers_types():
    # `n ** 2` of an int is an int: the math module's pow (always a float) is a prim of its own, not `**`'s.
    def f(x, n):
        results = [n ** 2, 2 ** n, n * 2, n // 2, n % 3, -n, abs(n), n + True, n / 2, math.pow(n, 2), math.floor(n / 2)]
        return x * 1.0, results, [type(r).__name__ for r in results]

    jf = minijit.jit(f)
    for n in (1, 2, 3, 5, 4):
        assert jf(torch.ones(1), n)[1:] == f(torch.ones(1), n)[1:]
    assert minijit.cache_info(jf).hits >= 2


@pytest.mark.parametrize("case", ["divide", "floor divide", "modulo", "floor of nan", "int of inf", "sqrt"])
def test_number_arithmetic_whose_result_is_unused_raises_where_eager_raises(case):
    # dce keeps a number prim that raises for some values (Effects.raises): eager computes it, and raises there.
    compute = {"divide": lambda n, g: n / (n - 3), "floor divide": lambda n, g: n // (n - 3),
               "modulo": lambda n, g: n % (n - 3), "floor of nan": lambda n, g: math.floor(g),
               "int of inf": lambda n, g: int(g), "sqrt": lambda n, g: math.sqrt(g - 1)}[case]

    def f(x, n, g):
        unused = compute(n, g)  # noqa: F841
        return x * 2

    jf = minijit.jit(f)
    for n, g in [(1, 1.5), (2, 2.5), (4, 3.5), (3, float("nan")), (5, float("inf")), (6, 0.5)]:
        try:
            want = f(torch.ones(1), n, g)
        except (ArithmeticError, ValueError) as e:
            with pytest.raises(type(e)):
                jf(torch.ones(1), n, g)
        else:
            torch.testing.assert_close(jf(torch.ones(1), n, g), want)
