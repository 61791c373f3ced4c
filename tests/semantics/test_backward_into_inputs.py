"""backward() inside a jitted function reaching the function's own arguments and leaves it makes itself
(`x.detach().requires_grad_()`, `torch.zeros(..., requires_grad=True)`): input gradients, FGSM, saliency.
Each jitted function is compared with the same function run eagerly on a copy of its module and inputs, over
several calls; the argument's `.grad` (None or set) is checked on every call, never baked into the trace."""

import copy

import pytest
import torch

import minijit


def _pair(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    return m, copy.deepcopy(m)


def _leaf_pair(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(*shape, requires_grad=True)
    return x, x.detach().clone().requires_grad_()


def _same_grads(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=name)


def _input_grad_step(model):
    def step(x):
        loss = model(x).pow(2).sum()
        loss.backward()
        return x.grad.clone()
    return step


def test_an_arguments_grad_is_set_then_accumulated_then_set_again_as_in_eager():
    m1, m2 = _pair()
    jitted, eager = minijit.jit(_input_grad_step(m1)), _input_grad_step(m2)
    x1, x2 = _leaf_pair(2, 4)
    # .grad None, set (added to in place), None again, set: two entries, the later calls hit them.
    for reset in (False, False, True, False):
        if reset:
            x1.grad = x2.grad = None
        m1.zero_grad()
        m2.zero_grad()
        before = x1.grad
        torch.testing.assert_close(jitted(x1), eager(x2))
        torch.testing.assert_close(x1.grad, x2.grad)
        assert x1.grad.stride() == x2.grad.stride()
        if before is not None:
            assert x1.grad is before  # accumulated into the user's .grad tensor itself, as eager does
        _same_grads(m1, m2)
    info = minijit.cache_info(jitted)
    assert (info.misses, info.entries, info.hits) == (2, 2, 2)
    assert "x.grad" in info.miss_reasons[1]


def test_arguments_of_other_shapes_with_or_without_a_grad_are_never_served_by_another_entry():
    m1, m2 = _pair()
    jitted, eager = minijit.jit(_input_grad_step(m1)), _input_grad_step(m2)
    for shape, grad_set in (((2, 4), True), ((5, 4), False), ((5, 4), True), ((3, 4), True), ((3, 4), False),
                            ((2, 4), True)):
        x1, x2 = _leaf_pair(*shape)
        if grad_set:
            x1.grad, x2.grad = torch.full(shape, 0.5), torch.full(shape, 0.5)
        torch.testing.assert_close(jitted(x1), eager(x2))
        torch.testing.assert_close(x1.grad, x2.grad)
        _same_grads(m1, m2)


def test_backward_with_inputs_reaches_only_the_argument_named():
    def step(x, y, w):
        loss = (x * w + y * w).pow(2).sum()
        loss.backward(inputs=[x])
        return loss.detach()

    jitted = minijit.jit(step)
    w = torch.randn(3)
    for _ in range(3):
        (x1, x2), (y1, y2) = _leaf_pair(3), _leaf_pair(3)
        torch.testing.assert_close(jitted(x1, y1, w), step(x2, y2, w))
        torch.testing.assert_close(x1.grad, x2.grad)
        assert y1.grad is None and y2.grad is None


def test_autograd_grad_of_an_argument_writes_no_grad():
    m1, m2 = _pair()

    def step(model):
        def run(x):
            (g,) = torch.autograd.grad(model(x).sum(), x)
            return g
        return run

    jitted = minijit.jit(step(m1))
    for _ in range(2):
        x1, x2 = _leaf_pair(2, 4)
        torch.testing.assert_close(jitted(x1), step(m2)(x2))
        assert x1.grad is None and x2.grad is None
        _same_grads(m1, m2)


def _fgsm(model, eps=0.1):
    def attack(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        x_adv = (x + eps * x.grad.sign()).clamp(-1, 1).detach()
        return x_adv, loss.detach()
    return attack


def test_fgsm_on_an_argument_matches_eager():
    m1, m2 = _pair(1)
    jitted, eager = minijit.jit(_fgsm(m1)), _fgsm(m2)
    for _ in range(3):
        x1, x2 = _leaf_pair(5, 4)
        y = torch.randint(0, 3, (5,))
        for a, b in zip(jitted(x1, y), eager(x2, y)):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(x1.grad, x2.grad)
        _same_grads(m1, m2)
    assert minijit.cache_info(jitted).misses == 2  # the model's .grads: None on the first call only


def _saliency(model):
    def saliency(x, y):
        x = x.detach().requires_grad_()
        score = model(x).gather(1, y[:, None]).sum()
        score.backward()
        return x.grad.abs().amax(dim=1), (x + 0.1 * x.grad.sign()).detach()
    return saliency


def test_a_leaf_made_by_requires_grad_inside_gets_its_grad_as_in_eager():
    m1, m2 = _pair(2)
    jitted, eager = minijit.jit(_saliency(m1)), _saliency(m2)
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
        for a, b in zip(jitted(x, y), eager(x, y)):
            torch.testing.assert_close(a, b)
        _same_grads(m1, m2)
        assert x.grad is None and not x.requires_grad


def _pgd(model, steps=3, eps=0.1, alpha=0.05):
    def attack(x, y):
        x_adv = x.clone()
        for _ in range(steps):  # a fresh leaf per step, each with its own .grad
            x_adv = x_adv.detach().requires_grad_()
            torch.nn.functional.cross_entropy(model(x_adv), y).backward()
            with torch.no_grad():
                x_adv = torch.min(torch.max(x_adv + alpha * x_adv.grad.sign(), x - eps), x + eps)
        return x_adv
    return attack


def test_pgd_with_a_leaf_per_step_matches_eager():
    m1, m2 = _pair(5)
    jitted, eager = minijit.jit(_pgd(m1)), _pgd(m2)
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
        torch.testing.assert_close(jitted(x, y), eager(x, y))
        _same_grads(m1, m2)


def test_a_leaf_made_by_a_factory_with_requires_grad_gets_its_grad_as_in_eager():
    m1, m2 = _pair(3)

    def step(model):
        def run(x):
            delta = torch.zeros(2, 4, requires_grad=True)
            model(x + delta).sum().backward()
            first = delta.grad.clone()
            model(x * 2 + delta).sum().backward()  # accumulated into delta.grad
            return first, delta.grad
        return run

    jitted = minijit.jit(step(m1))
    for _ in range(2):
        x = torch.randn(2, 4)
        for a, b in zip(jitted(x), step(m2)(x)):
            torch.testing.assert_close(a, b)
        _same_grads(m1, m2)


def test_autograd_grad_of_a_leaf_made_inside():
    m1, m2 = _pair(4)

    def step(model):
        def run(x):
            x = x.detach().requires_grad_()
            (g,) = torch.autograd.grad(model(x).pow(2).sum(), x)
            return g, x.grad
        return run

    x = torch.randn(3, 4)
    (g1, none1), (g2, none2) = minijit.jit(step(m1))(x), step(m2)(x)
    torch.testing.assert_close(g1, g2)
    assert none1 is None and none2 is None


def test_an_arguments_grad_set_to_none_inside_as_in_eager():
    def step(x):
        x.pow(3).sum().backward()
        g = x.grad.clone()
        x.grad = None
        return g

    jitted = minijit.jit(step)
    for _ in range(2):
        x1, x2 = _leaf_pair(4)
        torch.testing.assert_close(jitted(x1), step(x2))
        assert x1.grad is None and x2.grad is None


def test_a_backward_goes_on_through_an_arguments_history_outside_the_call_as_in_eager():
    """A frozen-encoder / trainable-head split: the encoder runs eagerly, the jitted step takes its output (with a
    history), runs the head, `loss.backward()`, the head's optimizer step. The head's parameters and the encoder's
    gradients (reached through the history outside the call) equal eager's, over several calls; a call whose
    argument is a leaf instead takes its own entry and fills its `.grad`."""
    torch.manual_seed(0)
    enc, head = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)
    enc2, head2 = copy.deepcopy(enc), copy.deepcopy(head)

    def make(head, opt):
        def step(h, y):
            loss = torch.nn.functional.mse_loss(head(h), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        return step

    eager = make(head, torch.optim.SGD(head.parameters(), lr=0.1))
    jitted = minijit.jit(make(head2, torch.optim.SGD(head2.parameters(), lr=0.1)))
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randn(5, 3)
        torch.testing.assert_close(jitted(enc2(x).tanh(), y), eager(enc(x).tanh(), y))
        _same_grads(enc, enc2)
        for p, q in zip(head.parameters(), head2.parameters()):
            torch.testing.assert_close(q, p)
    h1, h2 = _leaf_pair(5, 6)
    y = torch.randn(5, 3)
    torch.testing.assert_close(jitted(h2, y), eager(h1, y))
    torch.testing.assert_close(h2.grad, h1.grad)
    info = minijit.cache_info(jitted)
    assert (info.misses, info.hits) == (2, 2), info


def test_reading_a_grad_the_history_outside_accumulates_into_is_refused_naming_the_line():
    """After a backward that goes on through a history outside the call, the gradients it accumulates there are
    made after the call's computation: reading one inside is refused, naming the read; a later call whose graph
    reaches a tensor whose `.grad` the trace read after the backward fails the guard and is refused as it is traced
    again, before anything runs: never a stale read."""
    enc, head = torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)

    def reads_encoder_grad(h):
        h.sum().backward()
        return enc.weight.grad.clone()  # the read named

    with pytest.raises(minijit.MinijitError, match=r"enc\.weight\.grad\.clone\(\)"):
        minijit.jit(reads_encoder_grad)(enc(torch.randn(2, 4)))

    def step(h):
        head(h).sum().backward()
        return head.weight.grad.clone()

    jitted = minijit.jit(step)
    jitted(enc(torch.randn(2, 4)))  # head.weight is not in this graph: its .grad read after the backward is fine
    head.zero_grad()
    with pytest.raises(minijit.MinijitError, match=r"head\.weight\.grad\.clone\(\)"):
        jitted(enc(torch.randn(2, 4)) + head.weight[0, :6].sum())  # now it is
    assert head.weight.grad is None and head.bias.grad is None
    assert "_not_in_history" in minijit.cache_info(jitted).miss_reasons[-1]


def test_requires_grad_off_on_a_tensor_with_history_stays_refused_naming_the_line():
    def step(x):
        y = x * 2
        y.requires_grad_(False)
        return y

    with pytest.raises(minijit.MinijitError, match=r"y\.requires_grad_\(False\)"):
        minijit.jit(step)(torch.randn(3, requires_grad=True))


def test_returning_a_leaf_made_inside_is_refused_naming_the_line():
    m, _ = _pair()

    def step(x):
        z = x.detach().requires_grad_()
        m(z).sum().backward()
        return z

    with pytest.raises(minijit.MinijitError, match=r"leaf requiring grad it made itself.*requires_grad_\(\)"):
        minijit.jit(step)(torch.randn(2, 4))


def test_a_result_requiring_grad_only_through_a_leaf_made_inside_is_refused():
    def step(x):
        z = x.detach().requires_grad_()
        return (z * 2).sum()

    with pytest.raises(minijit.MinijitError, match=r"requires grad only through a leaf"):
        minijit.jit(step)(torch.randn(3))


@pytest.mark.parametrize("write", ["leaf", "view", "under_no_grad", "through_detach"])
def test_in_place_writes_into_a_leaf_made_inside_raise_where_eager_raises(write):
    """An in-place write with grad on into a leaf the traced code made (or a view of it) raises eager's error,
    naming the line; under no_grad, or through a detached alias, it runs and equals eager."""
    model, _ = _pair()

    def step(x):
        z = x.detach().requires_grad_()
        if write == "leaf":
            z.add_(1)
        elif write == "view":
            z[0].mul_(2)
        elif write == "under_no_grad":
            with torch.no_grad():
                z.add_(1)
        else:
            z.detach().mul_(3)
        model(z).sum().backward()
        return z.grad.clone()

    x = torch.randn(2, 4)
    if write in ("leaf", "view"):
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            step(x)
        with pytest.raises(minijit.errors.InplaceError, match="leaf Variable that requires grad") as raised:
            minijit.jit(step)(x)
        assert "z.add_(1)" in str(raised.value) or "z[0].mul_(2)" in str(raised.value)
    else:
        x_eager = x.clone()  # the write lands in x too (z = x.detach() shares its memory), as in eager
        got = minijit.jit(step)(x)
        for p in model.parameters():
            p.grad = None
        torch.testing.assert_close(got, step(x_eager))
        torch.testing.assert_close(x, x_eager)
