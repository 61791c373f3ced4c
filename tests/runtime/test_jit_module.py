"""minijit.jit(module) is an nn.Module: its methods act on the wrapped module, it copies and pickles."""

import copy
import io
import pickle

import pytest
import torch

import minijit
from minijit.runtime.module import JitModule


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.register_buffer("shift", torch.randn(3))
        self.scale = 1.0

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.scale + self.shift


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net()


def jitted_double(x):
    return x * 2 + 1


@minijit.jit
def decorated_double(x):
    return x * 2 + 1


def test_is_a_module_with_the_modules_names_and_tensors():
    net = make_net()
    jm = minijit.jit(net)
    assert isinstance(jm, torch.nn.Module)
    assert repr(jm) == f"minijit.jit({net!r})"
    assert list(jm.state_dict()) == list(net.state_dict())  # no `_orig_mod.` prefix
    assert [n for n, _ in jm.named_parameters()] == [n for n, _ in net.named_parameters()]
    assert all(a is b for a, b in zip(jm.parameters(), net.parameters(), strict=True))
    assert all(a is b for a, b in zip(jm.buffers(), net.buffers(), strict=True))
    assert [n for n, _ in jm.named_modules()] == [n for n, _ in net.named_modules()]
    assert list(jm.children()) == list(net.children())
    assert jm.fc1 is net.fc1 and jm.get_submodule("fc2") is net.fc2


def test_every_module_method_acts_on_the_wrapped_module():
    own = {"__init__", "__call__", "forward", "_call_impl", "_wrapped_call_impl", "_slow_forward", "compile",
           "__getattr__", "__setattr__", "__delattr__", "__dir__", "__repr__", "__getstate__", "__setstate__"}
    for name, value in vars(torch.nn.Module).items():
        # torch's own methods: libraries add some later (transformers' smart_apply, when it builds a model)
        torch_method = getattr(value, "__module__", "").startswith("torch.")
        if callable(value) and not isinstance(value, type) and name not in own and torch_method:
            assert getattr(JitModule, name) is not value, name


@pytest.mark.parametrize("method, args", [
    ("to", (torch.float64,)), ("double", ()), ("half", ()), ("bfloat16", ()), ("float", ()), ("cpu", ()),
    ("type", (torch.float64,)), ("train", (False,)), ("eval", ()), ("requires_grad_", (False,)),
    ("share_memory", ()), ("apply", (lambda m: torch.nn.init.zeros_(m.weight) if hasattr(m, "weight") else None,)),
])
def test_methods_returning_the_module_return_the_jitted_module(method, args):
    net, eager = make_net(), make_net()
    jm = minijit.jit(net)
    assert getattr(jm, method)(*args) is jm
    assert getattr(eager, method)(*args) is eager
    for (name, got), expected in zip(net.state_dict(keep_vars=True).items(), eager.state_dict(keep_vars=True).values(),
                                     strict=True):
        assert got.dtype == expected.dtype and got.requires_grad == expected.requires_grad, name
        torch.testing.assert_close(got, expected)
    assert [m.training for m in net.modules()] == [m.training for m in eager.modules()]
    assert jm.training == net.training
    x = torch.randn(2, 4, dtype=net.fc1.weight.dtype)
    with torch.no_grad():
        torch.testing.assert_close(jm(x), eager(x))


def test_attributes_pass_through():
    net = make_net()
    jm = minijit.jit(net)
    x = torch.randn(2, 4)
    with torch.no_grad():
        jm(x)
        jm.scale = 3.0
        assert net.scale == 3.0
        torch.testing.assert_close(jm(x), net(x))
    jm.fc2 = torch.nn.Linear(8, 3)
    assert net.fc2 is jm.fc2
    del jm.scale
    assert not hasattr(net, "scale")
    jm.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_load_state_dict_and_hooks_registered_through_the_wrapper():
    net, source = make_net(0), make_net(1)
    jm = minijit.jit(net)
    jm.load_state_dict(source.state_dict())
    jm.register_forward_hook(lambda module, args, out: out * 2)
    assert module_hooks(net) == 1
    source.register_forward_hook(lambda module, args, out: out * 2)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(jm(x), source(x))


def module_hooks(module):
    return len(module._forward_hooks)


def test_deepcopy_is_independent():
    net = make_net()
    jm = minijit.jit(net, cache="no caching")
    x = torch.randn(2, 4)
    jm(x)
    other = copy.deepcopy(jm)
    assert isinstance(other, JitModule) and other._orig_mod is not net
    assert other.fc1.weight is not net.fc1.weight
    assert minijit.cache_info(other).misses == 0  # its own cache
    assert other._minijit_function.cache_mode == "no caching"
    with torch.no_grad():
        other.fc1.weight.add_(1.0)
        torch.testing.assert_close(other(x), other._orig_mod(x))
        torch.testing.assert_close(jm(x), net(x))
    assert not torch.equal(other(x), jm(x))


@pytest.mark.parametrize("save", ["pickle", "torch.save"])
def test_pickling_saves_the_module_and_the_options(save):
    net = make_net()
    jm = minijit.jit(net, cache="symbolic values")
    if save == "pickle":
        loaded = pickle.loads(pickle.dumps(jm))
    else:
        buffer = io.BytesIO()
        torch.save(jm, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
    assert isinstance(loaded, JitModule) and loaded._minijit_function.cache_mode == "symbolic values"
    x = torch.randn(2, 4)
    for _ in range(3):
        out = loaded(x)
        torch.testing.assert_close(out, net(x))
        out.sum().backward()
    assert minijit.cache_info(loaded).misses == 1


def test_pickling_a_jitted_function():
    jf = minijit.jit(jitted_double, executors=["torch"])
    x = torch.randn(3)
    for original in (jf, decorated_double, copy.deepcopy(jf)):
        loaded = pickle.loads(pickle.dumps(original))
        for _ in range(3):
            torch.testing.assert_close(loaded(x), jitted_double(x))
    assert pickle.loads(pickle.dumps(decorated_double)) is decorated_double  # saved by its name
    loaded = pickle.loads(pickle.dumps(jf))
    assert loaded is not jf and loaded.fn is jitted_double and [e.name for e in loaded.executors] == ["torch"]


def test_a_jitted_submodule_in_an_eager_parent():
    parent, eager = make_parent(), make_parent()
    keys = list(parent.state_dict())
    parent.block = minijit.jit(parent.block)
    assert list(parent.state_dict()) == keys
    assert [n for n, _ in parent.named_parameters()] == [n for n, _ in eager.named_parameters()]
    parent.load_state_dict(eager.state_dict())
    assert parent.double() is parent and eager.double() is eager
    assert parent.block.fc1.weight.dtype == torch.float64
    x = torch.randn(2, 4, dtype=torch.float64)
    for _ in range(3):
        torch.testing.assert_close(parent(x), eager(x))
    parent.eval()
    assert not parent.block.training and not parent.block.fc1.training
    pickled = pickle.loads(pickle.dumps(parent))
    assert isinstance(pickled.block, JitModule)
    torch.testing.assert_close(pickled(x), eager.eval()(x))


def test_jitting_a_parent_of_a_jitted_submodule_traces_through_it():
    parent, eager = make_parent(), make_parent()
    parent.block = minijit.jit(parent.block)
    jp = minijit.jit(parent)
    x = torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(jp(x), eager(x))
    assert "block_fc1_weight" in minijit.last_traces(jp)[-1].python().splitlines()[0]
    parent.block = parent.block._orig_mod  # the same module, unwrapped: the same trace
    torch.testing.assert_close(jp(x), eager(x))
    assert (minijit.cache_info(jp).misses, minijit.cache_info(jp).hits) == (1, 2)


class ReadsItsBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Net()
        self.block.factor = 2.0

    def forward(self, x):
        self.block.batch = x.shape[0]
        return self.block(x) * self.block.factor


def test_a_parent_reads_and_writes_a_jitted_submodule_as_the_module():
    torch.manual_seed(0)
    parent = ReadsItsBlock()
    parent.block = minijit.jit(parent.block)
    jp = minijit.jit(parent)
    x = torch.randn(2, 4)
    for factor in (2.0, 2.0, 3.0, 3.0):
        parent.block.factor = factor  # read by the parent alone: its guard is the parent's trace's
        vars(parent.block._orig_mod).pop("batch", None)
        torch.testing.assert_close(jp(x), parent.block._orig_mod(x) * factor)
        assert parent.block._orig_mod.batch == 2  # the parent's write, replayed on the module on every call
    assert (minijit.cache_info(jp).misses, minijit.cache_info(jp).hits) == (2, 2)
    assert isinstance(parent.block, JitModule)  # the tree was never changed


class Parent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(4, 4)
        self.block = Net()

    def forward(self, x):
        return self.block(torch.relu(self.inp(x)))


def make_parent():
    torch.manual_seed(0)
    return Parent()


def test_container_modules_index_and_iterate():
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    jm = minijit.jit(seq)
    assert len(jm) == 2 and jm[0] is seq[0] and list(jm) == list(seq) and seq[1] in jm and bool(jm)
    with pytest.raises(TypeError):
        len(minijit.jit(make_net()))


def test_jitting_a_jitted_module_rewraps_the_module():
    net = make_net()
    again = minijit.jit(minijit.jit(net), cache="no caching")
    assert again._orig_mod is net and again._minijit_function.cache_mode == "no caching"


def test_torch_compile_on_top_is_refused():
    with pytest.raises(minijit.UnsupportedSyntaxError, match=r"torch\.compile it instead of jitting it"):
        minijit.jit(make_net()).compile()
