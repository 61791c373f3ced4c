"""Independent calls of one op gathered into one multi-tensor call (minijit/transforms/grouping.py, the torch
executor's `torch._foreach_*` calls): the same results as eager, to the bit, and no call moved past one it
depends on."""

from __future__ import annotations

import pytest
import torch

import minijit


def _grouped_names(jf: minijit.JitFunction) -> list[str]:
    return [b.sym.name for b in minijit.last_traces(jf)[-1].bound_symbols if b.sym.name.startswith("foreach_")]


def _params(n: int) -> list[torch.nn.Parameter]:
    shapes = [(8, 4), (4,), (3, 3, 2), (1,), (16,)]
    params = [torch.nn.Parameter(torch.randn(shapes[i % len(shapes)])) for i in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


# torch.optim's foreach code (a `torch._foreach_*` op per step of the update) and its for-loop code (the CPU's
# default: an op per parameter and step, which the group runs as one foreach op).
OPTIMIZERS = [
    (torch.optim.Adam, {}), (torch.optim.AdamW, {"weight_decay": 0.1}), (torch.optim.Adam, {"amsgrad": True}),
    (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}), (torch.optim.RMSprop, {"momentum": 0.5}),
    (torch.optim.Adagrad, {}), (torch.optim.NAdam, {}), (torch.optim.Adamax, {}),
    (torch.optim.AdamW, {"foreach": False}), (torch.optim.SGD, {"momentum": 0.9, "foreach": False}),
    (torch.optim.RAdam, {"foreach": False}),
]


@pytest.mark.parametrize("opt_class,options", OPTIMIZERS,
                         ids=[f"{c.__name__}{'-' + '-'.join(o) if o else ''}" for c, o in OPTIMIZERS])
def test_a_foreach_optimizer_step_is_grouped_and_equals_eager_to_the_bit(opt_class, options):
    torch.manual_seed(0)
    mine, theirs = _params(5), _params(5)
    with torch.no_grad():
        for a, b in zip(mine, theirs, strict=True):
            a.copy_(b)
            a.grad.copy_(b.grad)
    opt, eager_opt = (opt_class(ps, lr=0.1, **{"foreach": True, **options}) for ps in (mine, theirs))
    schedules = [torch.optim.lr_scheduler.CosineAnnealingLR(o, 10) for o in (opt, eager_opt)]
    step = minijit.jit(lambda: opt.step())
    for _ in range(4):
        step()
        eager_opt.step()
        for s in schedules:
            s.step()
        for a, b in zip(mine, theirs, strict=True):
            assert torch.equal(a, b)
            for key, value in eager_opt.state[b].items():
                assert torch.equal(opt.state[a][key], value), key
    assert _grouped_names(step), minijit.last_traces(step)[-1]


def test_calls_that_depend_on_each_other_or_share_memory_keep_their_order():
    def f(a, b, c, d):
        b.mul_(2)  # b, c and d: independent, one call
        c.mul_(3)
        d.mul_(4)
        y = a * 2  # reads a before the write below, z after it: never one call across the write
        a.mul_(3)
        z = a * 4
        a[:2].mul_(2)  # views of one tensor: each writes memory the other reads
        a[1:].mul_(5)
        e = b.sqrt()  # reads the b written above
        return y, z, e, c.sqrt(), (y * 2).sqrt()

    jf = minijit.jit(f)
    for n in (4, 4, 6):
        inputs = [torch.rand(n) + 0.5 for _ in range(4)]
        mine = [t.clone() for t in inputs]
        want = f(*inputs)
        got = jf(*mine)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        for m, t in zip(mine, inputs, strict=True):
            assert torch.equal(m, t)
    assert "foreach_mul_" in _grouped_names(jf), minijit.last_traces(jf)[-1]


def test_a_number_per_tensor_that_changes_each_call():
    def f(xs, scales):
        for x, s in zip(xs, scales, strict=True):
            x.mul_(s).add_(1.5)
        return [x.exp() for x in xs]

    jf = minijit.jit(f)
    for call in range(4):
        xs = [torch.randn(3) for _ in range(3)]
        mine = [x.clone() for x in xs]
        scales = [0.5 + call + i for i in range(3)]  # symbolic from the second call on (cache="automatic")
        for g, w in zip(jf(mine, scales), f(xs, scales), strict=True):
            assert torch.equal(g, w)
        assert all(torch.equal(m, x) for m, x in zip(mine, xs, strict=True))
    assert {"foreach_mul_", "foreach_add_", "foreach_exp"} <= set(_grouped_names(jf)), minijit.last_traces(jf)[-1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_in_place_multiply_by_a_number_in_half_precision_equals_eager_to_the_bit(dtype):
    # On the CPU, `torch._foreach_mul_(ts, 0.9)` rounds 0.9 to the tensors' dtype first, where `t.mul_(0.9)` does
    # not: a loop of `mul_` stays a loop (not grouped into the foreach op), and a foreach op written in the code (the
    # foreach optimizers' weight decay, `_foreach_mul_(exp_avgs, beta)`) keeps its rounding.
    def loop(ts, s):
        for t in ts:
            t.mul_(0.9).mul_(s)
        return [t.add(1) for t in ts]

    def foreach(ts, s):
        torch._foreach_mul_(ts, 0.9)
        torch._foreach_mul_(ts, [s] * len(ts))
        return [t.add(1) for t in ts]

    torch.manual_seed(0)
    for f in (loop, foreach):
        jf = minijit.jit(f)
        for s in (0.7, 0.3, 0.1):  # the number symbolic from the second call on
            ts = [torch.rand(64).to(dtype) for _ in range(6)]
            mine = [t.clone() for t in ts]
            for g, w in zip(jf(mine, s), f(ts, s), strict=True):
                assert torch.equal(g, w)
            assert all(torch.equal(m, t) for m, t in zip(mine, ts, strict=True)), f.__name__


def test_a_half_precision_optimizer_step_equals_eager_to_the_bit():
    torch.manual_seed(0)
    mine, theirs = _params(6), _params(6)
    for ps in (mine, theirs):
        with torch.no_grad():
            for p in ps:
                p.data = p.data.to(torch.bfloat16)
                p.grad = p.grad.to(torch.bfloat16)
    with torch.no_grad():
        for a, b in zip(mine, theirs, strict=True):
            a.copy_(b)
            a.grad.copy_(b.grad)
    for opt_class, options in ((torch.optim.Adadelta, {"foreach": False}), (torch.optim.AdamW, {"foreach": True})):
        opt, eager_opt = (opt_class(ps, weight_decay=0.1, **options) for ps in (mine, theirs))
        step = minijit.jit(lambda opt=opt: opt.step())
        for _ in range(3):
            step()
            eager_opt.step()
            for a, b in zip(mine, theirs, strict=True):
                assert torch.equal(a, b), opt_class
                for key, value in eager_opt.state[b].items():
                    assert torch.equal(opt.state[a][key], value), (opt_class, key)
