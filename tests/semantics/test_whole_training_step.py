"""A whole training step in one trace: forward, `loss.backward()`, clipping, the optimizer's step and `zero_grad()`
inside one jitted function, compared with the same function run eagerly on a copy of the model and optimizer."""

import copy

import pytest
import torch

import minijit


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(inplace=True), torch.nn.Linear(16, 3))


def _same_state(m1: torch.nn.Module, m2: torch.nn.Module, o1: torch.optim.Optimizer | None = None,
                o2: torch.optim.Optimizer | None = None, atol: float = 1e-6) -> None:
    for (name, p), q in zip(m1.named_parameters(), m2.parameters()):
        torch.testing.assert_close(q, p, atol=atol, rtol=1e-5, msg=name)
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=atol, rtol=1e-5, msg=f"{name}.grad")
            assert q.grad.stride() == p.grad.stride(), name
    for b1, b2 in zip(m1.buffers(), m2.buffers()):
        torch.testing.assert_close(b2, b1, atol=atol, rtol=1e-5)
    if o1 is not None:
        for s1, s2 in zip(o1.state.values(), o2.state.values()):
            for k in s1:
                torch.testing.assert_close(torch.as_tensor(s2[k]), torch.as_tensor(s1[k]), atol=atol, rtol=1e-5)


def _pair(make_model, make_opt):
    torch.manual_seed(0)
    m1 = make_model()
    m2 = copy.deepcopy(m1)
    return m1, make_opt(m1), m2, make_opt(m2)


def train_step(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return loss.detach()


OPTIMIZERS = {
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
    "adam-for-loop": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, foreach=False),
    "sgd-momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3),
}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_jitted_whole_step_matches_eager(optimizer):
    m1, o1, m2, o2 = _pair(_mlp, OPTIMIZERS[optimizer])
    step = minijit.jit(train_step)
    for _ in range(6):
        x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
        torch.testing.assert_close(step(m2, o2, x, y), train_step(m1, o1, x, y))
        _same_state(m1, m2, o1, o2)
    assert step.cache_info().misses <= 2


def test_a_small_transformer_trains_50_steps_as_eager_with_clipping_and_a_schedule():
    def make():
        # Without biases: a key projection's bias has a gradient of zero, whose rounding noise AdamW would amplify
        # into updates of the learning rate's size (in eager as in any other order of the same sums).
        return torch.nn.Sequential(
            torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True, bias=False),
            torch.nn.Flatten(), torch.nn.Linear(16 * 4, 5))

    m1, o1, m2, o2 = _pair(make, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01))
    s1 = torch.optim.lr_scheduler.CosineAnnealingLR(o1, T_max=50)
    s2 = torch.optim.lr_scheduler.CosineAnnealingLR(o2, T_max=50)
    step = minijit.jit(train_step)
    for i in range(50):
        x, y = torch.randn(3, 4, 16), torch.randint(0, 5, (3,))
        torch.manual_seed(i)
        expected = train_step(m1, o1, x, y)
        torch.manual_seed(i)
        torch.testing.assert_close(step(m2, o2, x, y), expected, atol=1e-5, rtol=1e-5)
        s1.step()
        s2.step()
    _same_state(m1, m2, o1, o2, atol=1e-5)
    assert step.cache_info().misses <= 4


def test_gradients_accumulate_over_calls_and_microbatches_as_in_eager():
    def accumulate(model, xs, ys):
        total = 0.0
        for x, y in zip(xs, ys):
            loss = torch.nn.functional.mse_loss(model(x), y) / len(xs)
            loss.backward()
            total = total + loss.detach()
        return total

    torch.manual_seed(0)
    m1 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    m2 = copy.deepcopy(m1)
    step = minijit.jit(accumulate)
    for i in range(5):
        xs, ys = [torch.randn(3, 4) for _ in range(2)], [torch.randn(3, 2) for _ in range(2)]
        torch.testing.assert_close(step(m2, xs, ys), accumulate(m1, xs, ys))
        _same_state(m1, m2)  # .grad accumulates over calls until zero_grad
        if i % 2 == 1:
            m1.zero_grad()
            m2.zero_grad()


def test_torch_autograd_grad_inside_with_a_manual_update_matches_eager():
    def manual_sgd(model, x, y):
        params = list(model.parameters())
        x = x.clone().requires_grad_(False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(0.1 * g)
        return loss.detach(), grads[0]

    torch.manual_seed(0)
    m1 = torch.nn.Linear(4, 2)
    m2 = copy.deepcopy(m1)
    step = minijit.jit(manual_sgd)
    for _ in range(4):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        expected, got = manual_sgd(m1, x, y), step(m2, x, y)
        torch.testing.assert_close(got, expected)
        assert not got[1].requires_grad
        _same_state(m1, m2)


def test_torch_autograd_grad_of_an_argument_matches_eager():
    def input_gradient(model, x):
        out = model(x).pow(2).sum()
        (g,) = torch.autograd.grad(out, x)
        return g * 2

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    jitted = minijit.jit(input_gradient)
    for _ in range(3):
        x = torch.randn(2, 4, requires_grad=True)
        torch.testing.assert_close(jitted(model, x), input_gradient(model, x))
        assert x.grad is None and all(p.grad is None for p in model.parameters())


def test_a_grad_scaler_step_matches_eager():
    def scaled_step(model, opt, scaler, x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss.detach()

    m1, o1, m2, o2 = _pair(lambda: torch.nn.Linear(4, 2), lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    c1, c2 = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8), torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    step = minijit.jit(scaled_step)
    for i in range(4):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        if i == 2:
            x[0, 0] = float("inf")  # a step the scaler skips, and a scale it lowers
        torch.testing.assert_close(step(m2, o2, c2, x, y), scaled_step(m1, o1, c1, x, y))
        _same_state(m1, m2)
        assert c1.get_scale() == c2.get_scale()


def test_a_non_contiguous_parameter_gets_its_gradient_laid_out_as_in_eager():
    class Transposed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 4).t())

        def forward(self, x):
            return x @ self.w

    def step(model, x):
        model(x).sum().backward()

    m1 = Transposed()
    m2 = copy.deepcopy(m1)
    x = torch.randn(2, 4)
    step(m1, x)
    minijit.jit(step)(m2, x)
    _same_state(m1, m2)


def test_assigning_grad_inside_matches_eager():
    def set_grads(model, scale):
        for p in model.parameters():
            p.grad = torch.ones_like(p) * scale.sum()

    m1 = torch.nn.Linear(3, 2)
    m2 = copy.deepcopy(m1)
    scale = torch.tensor([1.0, 2.0])
    set_grads(m1, scale)
    minijit.jit(set_grads)(m2, scale)
    _same_state(m1, m2)


def test_errors_of_eager_backward_are_raised_as_eager_raises_them():
    def no_grad_loss(model, x):
        model(x).detach().sum().backward()

    def not_scalar(model, x):
        model(x).backward()

    model = torch.nn.Linear(3, 2)
    for fn in (no_grad_loss, not_scalar):
        with pytest.raises(RuntimeError) as eager:
            fn(model, torch.randn(2, 3))
        with pytest.raises(RuntimeError) as jitted:
            minijit.jit(fn)(model, torch.randn(2, 3))
        assert str(jitted.value).split(" (")[0] == str(eager.value).split(" (")[0]


def test_what_the_trace_cannot_do_is_refused_by_name():
    model = torch.nn.Linear(3, 2)

    def create_graph(model, x):
        model(x).sum().backward(create_graph=True)

    def returns_after(model, x):
        model(x).sum().backward()
        return model(x)

    with pytest.raises(minijit.UnsupportedSyntaxError, match="create_graph"):
        minijit.jit(create_graph)(model, torch.randn(2, 3))
    with pytest.raises(minijit.UnsupportedSyntaxError, match="computed with grad"):
        minijit.jit(returns_after)(model, torch.randn(2, 3))
    assert all(p.grad is None for p in model.parameters())


def _zero_first(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def _keeping_zeros(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(inputs=list(model[0].parameters()))  # only the first layer's gradients
    opt.step()
    opt.zero_grad(set_to_none=False)
    return loss.detach()


@pytest.mark.parametrize("step_fn", [_zero_first, _keeping_zeros], ids=["zero-grad-first", "set-to-none-false"])
def test_other_orders_of_a_step_match_eager(step_fn):
    m1, o1, m2, o2 = _pair(_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, foreach=True))
    step = minijit.jit(step_fn)
    for _ in range(4):
        x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
        torch.testing.assert_close(step(m2, o2, x, y), step_fn(m1, o1, x, y))
        _same_state(m1, m2, o1, o2)


def test_tensor_hooks_on_parameters_and_arguments_run_as_in_eager_when_registered_or_removed_between_calls():
    """`Tensor.register_hook` on a leaf a traced backward reaches: eager runs the hook on the gradient before
    accumulating it (and before `torch.autograd.grad` returns it). The hooks are traced with the gradient; the
    guard holds each tensor's hooks, so one registered or removed between calls is a miss, not a stale trace."""

    def step(model, w, x):
        (model(x) * w).sum().backward()
        return torch.autograd.grad((model(x) * w).sum(), w)[0]

    m1, _, m2, _ = _pair(_mlp, lambda m: None)
    w1, w2 = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    jitted = minijit.jit(step)
    handles: dict[int, list] = {1: [], 2: []}
    for i in range(6):
        for side, m, w in ((1, m1, w1), (2, m2, w2)):
            if i == 1:
                handles[side] += [m[0].weight.register_hook(lambda g: g * 3), w.register_hook(lambda g: g + 1)]
            if i == 3:
                m[2].bias.register_hook(lambda g: None)  # None: the gradient as it was
            if i == 4:
                handles[side][0].remove()
        x = torch.randn(5, 6)
        torch.testing.assert_close(jitted(m2, w2, x), step(m1, w1, x))
        _same_state(m1, m2)
        torch.testing.assert_close(w2.grad, w1.grad)
    assert jitted.cache_info().misses <= 5, jitted.cache_info()


def test_a_hook_on_an_argument_with_a_history_runs_once_as_in_eager():
    """A hook on a tensor computed outside with grad: eager's backward through its history runs it (so the trace
    does not); `torch.autograd.grad` of it returns the gradient after the hook, as eager's."""

    def step(t):
        (t * 3).sum().backward(retain_graph=True)
        return torch.autograd.grad((t * 3).sum(), t)[0]

    w1, w2 = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    jitted = minijit.jit(step)
    for i in range(3):
        t1, t2 = w1 * 2, w2 * 2
        if i:
            t1.register_hook(lambda g: g * 10)
            t2.register_hook(lambda g: g * 10)
        torch.testing.assert_close(jitted(t2), step(t1))
        torch.testing.assert_close(w2.grad, w1.grad)


def test_post_accumulate_grad_hooks_run_an_optimizer_in_backward_as_in_eager():
    """`register_post_accumulate_grad_hook` on each parameter (an optimizer stepped inside the backward, one per
    parameter): eager runs the hook on the parameter once its gradient is accumulated; so does the trace."""

    def setup(model):
        opts = {p: torch.optim.AdamW([p], lr=1e-2) for p in model.parameters()}

        def hook(p):
            opts[p].step()
            opts[p].zero_grad()

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(hook)
        return opts

    def step(model, x, y):
        torch.nn.functional.cross_entropy(model(x), y).backward()

    m1, o1, m2, o2 = _pair(_mlp, setup)
    jitted = minijit.jit(step)
    for _ in range(5):
        x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
        jitted(m2, x, y)
        step(m1, x, y)
        _same_state(m1, m2)
        for p1, p2 in zip(m1.parameters(), m2.parameters()):
            for k, v in o1[p1].state[p1].items():
                torch.testing.assert_close(o2[p2].state[p2][k], v)
    assert jitted.cache_info().misses <= 2, jitted.cache_info()


def test_a_sparse_embedding_gradient_is_set_sparse_as_in_eager():
    """`nn.Embedding(sparse=True)`: eager's AccumulateGrad keeps the sparse gradient as the new `.grad`; the call
    sets it as it is (it was copied into a dense tensor, which raised), and SGD steps with it as in eager."""

    def step(model, opt, ix):
        model(ix).sum().backward()
        grad = model[0].weight.grad
        opt.step()
        return grad

    m1, o1, m2, o2 = _pair(lambda: torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2)),
                           lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    jitted = minijit.jit(step)
    for i in range(3):
        ix = torch.tensor([i, 2 * i + 1])
        have, want = jitted(m2, o2, ix), step(m1, o1, ix)
        assert have.layout == want.layout == torch.sparse_coo
        torch.testing.assert_close(have.to_dense(), want.to_dense())
        _same_state(m1, m2)
        o1.zero_grad()
        o2.zero_grad()
