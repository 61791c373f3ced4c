"""The Inductor executor against eager torch: values, gradients, in-place updates, the region cache.

Inductor compiles C++ per region (a second or more each), so the regions are small and
the heavier ones live in module-scoped fixtures that several tests share; the tests
compare with eager on the same inputs, and count traces and torch.compile's graphs
where compiling again is the bug.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F

import minijit
from executors.inductor import CACHE, InductorExecutor, cache_info
from executors.inductor import ex as inductor_ex
from minijit.extend import ExecutorUnavailableError, get_executor, resolve_executors

if inductor_ex.unavailable_reason() is not None:
    pytest.skip(f"inductor is unavailable: {inductor_ex.unavailable_reason()}", allow_module_level=True)


def final_source(jf):
    return minijit.last_traces(jf)[-1].python()


def block(x, w, b, g):
    """LayerNorm, a linear (left to torch), GELU, a residual and a softmax: two regions around the matmul."""
    h = F.layer_norm(x, (x.shape[-1],), g, None, 1e-5)
    y = F.gelu(F.linear(h, w, b)) + x * 0.5
    return torch.softmax(y * 2.0, dim=-1).sum(0) - y.mean()


def block_inputs(seed=0):
    torch.manual_seed(seed)
    return [torch.randn(6, 8), torch.randn(8, 8) * 0.3, torch.randn(8), torch.rand(8) + 0.5]


def adam_step(params, grads, exp_avgs, exp_avg_sqs):
    """An in-place Adam-like update over a list of parameters (no return value)."""
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.mul_(0.9).add_(g, alpha=0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.addcdiv_(m, v.sqrt().add_(1e-8), value=-0.01)


def adam_step_again(params, grads, exp_avgs, exp_avg_sqs):
    """The same update written as another Python function (a different jitted function)."""
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.mul_(0.9).add_(g, alpha=0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.addcdiv_(m, v.sqrt().add_(1e-8), value=-0.01)


def flat(groups):
    return [t for group in groups for t in group]


def adam_state(seed=0):
    torch.manual_seed(seed)
    shapes = [(4, 3), (5,), (2, 2, 2)]
    return [[torch.randn(s) for s in shapes], [torch.randn(s) for s in shapes],
            [torch.randn(s) for s in shapes], [torch.rand(s) for s in shapes]]


@pytest.fixture(scope="module")
def trained():
    """The block run under jit with inputs requiring grad, and its backward, next to eager's."""
    leaves = [t.requires_grad_() for t in block_inputs()]
    jf = minijit.jit(block, executors=["inductor"])
    out = jf(*leaves)
    out.sum().backward()
    got_grads = [t.grad.clone() for t in leaves]
    eager_leaves = [t.detach().clone().requires_grad_() for t in block_inputs()]
    want = block(*eager_leaves)
    want.sum().backward()
    return jf, out, got_grads, want, [t.grad for t in eager_leaves]


@pytest.fixture(scope="module")
def adam_run():
    """One jitted Adam step (compiled once) next to eager's, with the tensors it mutated."""
    state, eager_state = adam_state(), adam_state()
    versions = [t._version for group in state for t in group]
    jf = minijit.jit(adam_step, executors=["inductor"])
    with torch.no_grad():
        jf(*state)
        adam_step(*eager_state)
    return jf, state, eager_state, versions


def test_forward_matches_eager(trained):
    _, out, _, want, _ = trained
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_backward_matches_eager(trained):
    _, _, got, _, want = trained
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_the_matmul_joins_its_neighbours_in_one_compiled_region(trained):
    jf = trained[0]
    src = final_source(jf)
    assert "torchex.linear" not in src and "torchex.matmul" not in src, src
    assert src.count("inductorex.fusion_") == 1, src
    # No op of the block is left to eager torch.
    assert "torchex.gelu" not in src and "torchex.softmax" not in src and "torchex.layer_norm" not in src, src


def test_matmuls_stay_with_torch_when_told(monkeypatch):
    monkeypatch.setattr(inductor_ex, "fuse_matmul", False)
    jf = minijit.jit(block, executors=["inductor"])
    inputs = block_inputs(1)
    torch.testing.assert_close(jf(*inputs), block(*inputs), rtol=1e-5, atol=1e-5)
    src = final_source(jf)
    assert "torchex.linear" in src and src.count("inductorex.fusion_") == 2, src


def test_inplace_update_lands_in_inputs_like_eager(adam_run):
    _, state, eager_state, versions = adam_run
    for got_group, want_group in zip(state, eager_state):
        for got, want in zip(got_group, want_group):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # grads are only read; every other tensor was written in place, and autograd can see it.
    new_versions = [t._version for group in state for t in group]
    n = len(state[0])
    assert new_versions[n:2 * n] == versions[n:2 * n]
    assert all(a > b for i, (a, b) in enumerate(zip(new_versions, versions)) if not n <= i < 2 * n)


def test_whole_adam_step_is_one_region(adam_run):
    src = final_source(adam_run[0])
    assert src.count("inductorex.fusion_") == 1, src
    assert "torchex." not in src, src


def test_second_call_reuses_the_entry_and_matches_eager(adam_run):
    jf = adam_run[0]
    state, eager_state = adam_state(1), adam_state(1)
    before = cache_info()
    with torch.no_grad():
        jf(*state)
        adam_step(*eager_state)
    assert cache_info() == before
    for got, want in zip(flat(state), flat(eager_state)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_region_cache_is_shared_across_jitted_functions(adam_run):
    first = minijit.last_traces(adam_run[0])[-1].bound_symbols[0].sym.fn
    before = cache_info()
    state, eager_state = adam_state(2), adam_state(2)
    jf = minijit.jit(adam_step_again, executors=["inductor"])
    with torch.no_grad():
        jf(*state)
        adam_step(*eager_state)
    after = cache_info()
    assert after["misses"] == before["misses"] and after["hits"] == before["hits"] + 1
    assert minijit.last_traces(jf)[-1].bound_symbols[0].sym.fn is first
    for got, want in zip(flat(state), flat(eager_state)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_region_compiles_once_on_its_first_run(adam_run):
    traces = minijit.last_traces(adam_run[0])
    claim = next(t for t in traces if t.pass_name == "claim executors")
    region = claim.bound_symbols[0].sym.fn
    assert region in CACHE.entries.values()
    assert region.compile_s is not None and region.compile_s > 0


def scaled_by_a_parameter(x, w):
    return (x * w).sin() + w


def test_a_region_reading_a_parameter_under_no_grad_compiles_once():
    # Compiled from example tensors (plain, requires_grad=False), the region failed torch.compile's guards on the
    # first real call (an nn.Parameter that requires grad) and compiled a second time.
    jf = minijit.jit(scaled_by_a_parameter, executors=["inductor"])
    w = torch.nn.Parameter(torch.randn(6))
    compiled = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(6)
            torch.testing.assert_close(jf(x, w), scaled_by_a_parameter(x, w))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled + 1


def test_single_op_regions_run_as_torch_calls():
    x = torch.randn(3)
    jf = minijit.jit(lambda a: a + 1, executors=["inductor"])
    before = cache_info()
    torch.testing.assert_close(jf(x), x + 1)
    assert cache_info() == before
    src = final_source(jf)
    assert "torchex." in src and "inductorex." not in src, src


def test_a_copy_into_a_memory_format_fuses_with_its_neighbours():
    # `.contiguous()` of a transposed value is `prims.copy_in_format(x, torch.contiguous_format)`: a region holding it
    # could not be written out (no literal for the format), and the whole trace ran as torch calls (a prompt's
    # attention output in generate(), 244 prims).
    def f(x):
        y = (x * 2).transpose(0, 1).contiguous()
        return y * 3 + 1, y.is_contiguous()

    x = torch.randn(4, 3)
    jf = minijit.jit(f, executors=["inductor"])
    got, want = jf(x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] and got[0].stride() == want[0].stride()
    src = final_source(jf)
    assert "inductorex." in src and "torchex." not in src, src


def test_unavailable_without_a_cpp_compiler(monkeypatch):
    from torch._inductor import cpp_builder

    def no_compiler():
        raise RuntimeError("no g++ here")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    ex = InductorExecutor()
    assert "no g++ here" in ex.unavailable_reason()
    with pytest.raises(ExecutorUnavailableError, match=r"inductor.*no g\+\+ here"):
        resolve_executors([ex])


def test_found_by_name():
    assert get_executor("inductor") is inductor_ex


def test_symbolic_sizes_compile_one_dynamic_region():
    def f(x, y):
        return (x.sin() * y + 1).exp().sum(-1)

    jf = minijit.jit(f, executors=["inductor"], cache="symbolic values")
    for n in (5, 7):
        x, y = torch.randn(3, n), torch.randn(3, n)
        torch.testing.assert_close(jf(x, y), f(x, y))
    src = final_source(jf)
    assert src.count("inductorex.fusion_") == 1 and "torchex." not in src, src
    assert minijit.cache_info(jf).misses == 1


def reshaped_by_its_sizes(x, w, scale):
    """Views whose sizes are arithmetic on x's sizes, a matmul and a Python float: under symbolic values, the sizes
    and the float are numbers of the trace that the compiled region takes as inputs."""
    b, n, d = x.shape
    h = (x * scale).view(b, n * d // 4, 4) @ w
    return (h.reshape(b, -1).softmax(-1) * scale).sum(0) * n


def test_symbolic_sizes_and_numbers_fuse_with_their_views_into_one_region():
    jf = minijit.jit(reshaped_by_its_sizes, executors=["inductor"], cache="symbolic values")
    w = torch.randn(4, 3)
    for n, scale in ((4, 0.5), (6, 1.5), (8, 2.25), (10, -0.75)):
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(jf(x, w, scale), reshaped_by_its_sizes(x, w, scale))
    src = final_source(jf)
    assert src.count("inductorex.fusion_") == 1 and "torchex." not in src, src
    assert minijit.cache_info(jf).misses == 1


def _static(size):
    """Whether a size of a compiled graph's input is a constant (an int, or a symbol the graph specialized)."""
    return type(size) is int or size.node.shape_env.replace(size.node.expr).is_number


def test_only_the_sizes_the_trace_keeps_symbolic_are_dynamic_in_the_compiled_region(monkeypatch):
    # Compiled with dynamic=True, every dim of every input was symbolic, and Inductor's kernels over symbolic sizes
    # are slower: an AdamW step under an lr schedule (a float input, every shape constant) ran 589 against 410 µs.
    graphs = []

    def recording(gm, example_inputs):
        values = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
        graphs.append([tuple(_static(d) for d in t.shape) for t in values if isinstance(t, torch.Tensor)])
        return gm.forward

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, backend, **kw: compile_(fn, backend=recording, **kw))
    CACHE.clear()
    w = torch.randn(4, 3)

    def weighted(x, scale):  # w is read from outside: its shape is a constant of the trace, guarded
        return reshaped_by_its_sizes(x, w, scale)

    jf = minijit.jit(weighted, executors=["inductor"])  # automatic: symbolic from the second call on
    for n, scale in ((4, 0.5), (6, 1.5), (8, 2.25), (10, -0.5)):
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(jf(x, scale), weighted(x, scale))
    # the second call's trace: x's length symbolic (the one size that changed), its other sizes and w's constant,
    # the scale a 0-d input; one graph serves every length and scale after it
    assert minijit.cache_info(jf).misses == 2
    assert len(graphs) == 2 and sorted(graphs[1]) == [(), (True, False, True), (True, True)], graphs


def scaled_by_item(x, s):
    return (x * s.item() + s.item() ** 2).sin()


def test_a_number_computed_by_item_is_an_input_of_the_region_not_a_constant():
    # Tensor.item() is nan until the trace runs: compiled from that value (an example), the region was specialised
    # to it and compiled again on every call (torch.compile guards a non-finite float by value). Compiled from the
    # call's own value, the number stays an input of the compiled function for every value.
    jf = minijit.jit(scaled_by_item, executors=["inductor"])
    x = torch.randn(5)
    jf(x, torch.tensor(0.5))
    compiled = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for v in (1.5, -2.0, 3.25):
        s = torch.tensor(v)
        torch.testing.assert_close(jf(x, s), scaled_by_item(x, s))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled
    assert minijit.cache_info(jf).misses == 1


def attention_block(q, k, v, mask, dropout_p=0.0):
    return F.scaled_dot_product_attention(q * 2, k, v, mask, dropout_p=dropout_p).relu()


@pytest.mark.parametrize("length", [128, 4])
def test_long_attention_is_called_whole_in_its_region(length):
    # Inductor calls torch's own attention kernel for an attention call, which beats the decomposition compiled
    # (1.5x at 4 x 4 x 128 x 64); for a few scores (a decode step's single query) the decomposition, fused with its
    # neighbours, wins. Either way one region, equal to eager.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, length, 16) for _ in range(3))
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    jf = minijit.jit(attention_block, executors=["inductor"])
    torch.testing.assert_close(jf(q, k, v, mask), attention_block(q, k, v, mask))
    src = final_source(jf)
    assert src.count("inductorex.fusion_") == 1 and "torchex." not in src, src
    assert ("# t25 = ltorch.scaled_dot_product_attention" in src) is (length == 128), src


def test_attention_with_dropout_is_never_called_in_a_region():
    # Dropout draws random numbers, in eager's order only with the torch executor.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 128, 16) for _ in range(3))
    mask = torch.ones(128, 128, dtype=torch.bool).tril()
    jf = minijit.jit(attention_block, executors=["inductor"])
    torch.manual_seed(1)
    got = jf(q, k, v, mask, 0.5)
    torch.manual_seed(1)
    torch.testing.assert_close(got, attention_block(q, k, v, mask, 0.5))
    src = final_source(jf)
    assert "torchex.scaled_dot_product_attention(" in src, src
    assert "# t25 = ltorch.scaled_dot_product_attention" not in src, src


def _adamw_with_schedule(seed):
    torch.manual_seed(seed)
    params = [torch.randn(4, 3, requires_grad=True) for _ in range(3)]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    return params, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


def test_an_optimizer_step_count_stays_a_tensor_so_the_step_is_one_region():
    # torch.optim reads its step count with `item()` in eager (`_get_value`), and keeps it a tensor under
    # torch.compile. With the count read, each parameter's bias corrections split the step into a region per
    # parameter; kept a tensor, as the Inductor executor asks, the step of torch.optim.AdamW is one region,
    # under an lr that changes every call.
    runs = []
    for jitted in (False, True):
        params, opt, schedule = _adamw_with_schedule(0)
        step = minijit.jit(opt.step, executors=["inductor"]) if jitted else opt.step
        for i in range(4):
            for p in params:
                p.grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(i))
            with torch.no_grad():
                step()
            schedule.step()
        runs.append(([p.detach().clone() for p in params], opt.state_dict()["state"]))
    (eager_params, eager_state), (jit_params, jit_state) = runs
    torch.testing.assert_close(jit_params, eager_params)
    torch.testing.assert_close(jit_state, eager_state)
    src = final_source(step)
    assert src.count("inductorex.fusion_") == 1 and "item" not in src, src
    assert minijit.cache_info(step).misses <= 2


def test_a_region_that_fails_to_compile_again_runs_its_torch_calls(monkeypatch):
    # torch.compile recompiles lazily, on a call whose inputs fail its guards; where that compile fails, nothing
    # has run, and the region's torch calls give eager's result.
    def f(x):
        return (x.sin() * 3.25).exp()

    jf = minijit.jit(f, executors=["inductor"])
    x = torch.randn(4)
    torch.testing.assert_close(jf(x), f(x))
    (region,) = [r for r in CACHE.entries.values() if "prims_mul(v0, 3.25)" in r.source]

    def recompile_fails(*args):
        raise torch._dynamo.exc.TorchRuntimeError("a compile for new inputs failed")

    monkeypatch.setattr(region, "compiled", recompile_fails)
    strided = torch.randn(8)[::2]  # (a layout the graph was not compiled for: torch.compile's guards fail)
    with pytest.warns(UserWarning, match="could not compile a region"):
        torch.testing.assert_close(jf(strided), f(strided))
    torch.testing.assert_close(jf(x * 3), f(x * 3))


def keys_cached(x, empty):
    """Keys made by a transposed view, put after an empty cache, as transformers' DynamicLayer stores its first."""
    k = (x * 2).view(2, 8, 2, 16).transpose(1, 2)
    return torch.cat([empty, k], dim=-2)


def test_a_result_contiguous_in_eager_is_contiguous():
    # Inductor laid this result out transposed (as its input); stored in a cache and passed back, the layout then
    # failed the guard of the entry traced with eager's, and every generate() traced one entry more.
    jf = minijit.jit(keys_cached, executors=["inductor"])
    args = torch.randn(2, 8, 32), torch.tensor([])
    got, want = jf(*args), keys_cached(*args)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


def keys_slid(x, empty):
    """A sliding-window key cache (transformers' DynamicSlidingWindowLayer): the last keys of a cat after an empty
    cache are kept as a view, the whole cat is used."""
    full = torch.cat([empty, (x * 2).view(2, 8, 2, 8).transpose(1, 2)], dim=-2)
    return full[:, :, -7:, :], (full * 3).sum(-1)


def test_a_view_of_a_result_contiguous_in_eager_has_eager_strides():
    # Inductor laid the cat out transposed (as its input), so the kept keys had other strides than eager's, and the
    # next decode step's stride guard failed: one trace more per generate() of Mistral and Gemma2.
    jf = minijit.jit(keys_slid, executors=["inductor"])
    args = torch.randn(2, 8, 16), torch.zeros(2, 2, 0, 8)
    got, want = jf(*args), keys_slid(*args)
    torch.testing.assert_close(got, want)
    assert got[0].stride() == want[0].stride()


def rows_and_exp(x):
    """Views returned next to their bases: a row of the input, and a row of a value returned too."""
    h = x * 2
    return x[0], h[0], h, h.exp()


def test_views_and_their_bases_stay_aliased_when_the_input_layout_changes():
    # A row of a contiguous tensor is contiguous, and so is `x * 2`: returned `.contiguous()`, on a transposed
    # input (the same entry: layouts are not guarded) the row of x and `h` came back copies, and writes into the
    # rows did not reach x and h as in eager.
    jf = minijit.jit(rows_and_exp, executors=["inductor"])
    for x in (torch.randn(4, 4), torch.randn(4, 4).t()):
        x_eager = x.clone()
        got, want = jf(x), rows_and_exp(x_eager)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        assert got[0].stride() == want[0].stride()
        for t in (*got[:2], *want[:2]):
            t.add_(100)
        torch.testing.assert_close(x, x_eager)
        torch.testing.assert_close(got[2], want[2])


def checked_then_written(x, y):
    y.add_(1)
    if (x > 0).all():
        return (x * y).exp()
    return (x - y).exp()


def test_value_checks_stay_outside_regions():
    # A value check may end the call (another entry takes it): it is no op for a compiled region to hold.
    jf = minijit.jit(checked_then_written, executors=["inductor"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="minijit: inductor could not compile")
        for s in (1.0, -1.0, 2.0):
            x, y, y_eager = torch.tensor([s, 1.0]), torch.ones(2), torch.ones(2)
            torch.testing.assert_close(jf(x, y), checked_then_written(x, y_eager))
            torch.testing.assert_close(y, y_eager)
    assert "prims_check_value" not in "".join(r.source for r in CACHE.entries.values())


def write_then_read(a, b):
    a.mul_(2).add_(1)
    return (b * 3).sin()


@pytest.mark.parametrize("alias", ["none", "same", "overlapping view"])
def test_written_input_overlapping_another_input_matches_eager(alias):
    def make():
        torch.manual_seed(0)
        x = torch.randn(4)
        return {"none": (x, torch.randn(4)), "same": (x, x), "overlapping view": (x, x[1:3])}[alias]

    (a, b), (ea, eb) = make(), make()
    jf = minijit.jit(write_then_read, executors=["inductor"])
    torch.testing.assert_close(jf(a, b), write_then_read(ea, eb))
    torch.testing.assert_close(a, ea)
    torch.testing.assert_close(b, eb)
    assert "inductorex.fusion_" in final_source(jf)


def test_each_region_function_has_a_source_file_of_its_own():
    # torch.compile (2.11) runs a function whose source file it cannot find inside one shared wrapper
    # frame, which hits Dynamo's recompile limit after 8 regions (FailOnRecompileLimitHit under fullgraph).
    import inspect

    from executors.inductor.codegen import RegionSource, make_function

    src = RegionSource(source="def region(i0):\n    return (torch.sin(i0),)\n", globals={"torch": torch},
                       passthrough=[None], n_returned=1, written=[])
    a, b = make_function(src), make_function(src)
    assert a.__code__ is not b.__code__
    files = {inspect.getsourcefile(a), inspect.getsourcefile(b)}
    assert None not in files and len(files) == 2
    assert inspect.getsource(a) == src.source
    torch.testing.assert_close(a(torch.ones(3))[0], torch.sin(torch.ones(3)))


def test_an_entry_traced_for_separate_inputs_never_serves_aliased_ones():
    # A region whose written inputs the trace's memory model shows apart from its other inputs does not look at
    # the call's storages: the entry's guard (which inputs share memory, the tensors read from outside among them)
    # keeps calls with aliased inputs away.
    held = [torch.randn(4)]

    def write_then_read_held(a, b):
        a.mul_(2).add_(1)
        return (b * 3).sin() + held[0].sum().cos()

    def make(alias):
        torch.manual_seed(0)
        x, other, outside = torch.randn(4), torch.randn(4), torch.randn(4)
        args = {"none": (x, other), "same": (x, x), "overlapping view": (x, x[1:3]), "held": (x, other)}[alias]
        return args, x if alias == "held" else outside  # "held": the tensor read from outside is the one written

    jf = minijit.jit(write_then_read_held, executors=["inductor"])
    for alias in ["none", "same", "overlapping view", "none", "held", "same", "none"]:
        (a, b), held[0] = make(alias)
        got = jf(a, b)
        (ea, eb), held[0] = make(alias)
        torch.testing.assert_close(got, write_then_read_held(ea, eb), msg=alias)
        torch.testing.assert_close(a, ea, msg=alias)
    assert "inductorex.fusion_" in final_source(jf)


def test_a_region_s_graph_is_called_without_torch_compile_s_frame():
    # Once compiled, an optimizer step's region calls the graph Inductor compiled directly (executors/inductor/
    # direct.py): the lr, lifted by torch.compile into a tensor input, still changes every call.
    runs = []
    for jitted in (False, True):
        params, opt, schedule = _adamw_with_schedule(1)
        step = minijit.jit(opt.step, executors=["inductor"]) if jitted else opt.step
        through_frame = []
        for i in range(6):
            for p in params:
                p.grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(i))
            with torch.no_grad():
                step()
            schedule.step()
            if jitted and i == 1:
                regions = [r for r in CACHE.entries.values() if "lerp" in r.source and r.graph]
                assert regions
                for region in regions:
                    region.compiled = _counted(region.compiled, through_frame)
        runs.append([p.detach().clone() for p in params])
    torch.testing.assert_close(runs[1], runs[0])
    assert through_frame == []


def _counted(fn, calls):
    @functools.wraps(fn)  # (keeping torch.compile's attributes, which `Direct.find` reads)
    def counted(*args):
        calls.append(1)
        return fn(*args)

    return counted


def _scaled_exp(x):
    return (x.sin() * 2.75).exp() + x


def test_a_layout_the_graph_was_not_compiled_for_goes_through_torch_compile():
    # The graph called directly was compiled for its inputs' strides; a transposed input goes through
    # torch.compile's frame, which compiles again (Inductor's own size check would raise otherwise).
    jf = minijit.jit(_scaled_exp, executors=["inductor"])
    x = torch.randn(6, 6)
    for arg in (x, x, x.t(), x.t(), x):
        torch.testing.assert_close(jf(arg), _scaled_exp(arg))
    (region,) = [r for r in CACHE.entries.values() if "prims_mul(v0, 2.75)" in r.source]
    assert region.graph is not None


def _scaled_exp_again(x):
    return (x.sin() * 2.625).exp() + x


def test_a_graph_is_called_directly_only_under_the_state_it_was_compiled_under():
    jf = minijit.jit(_scaled_exp_again, executors=["inductor"])
    x = torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(jf(x), _scaled_exp_again(x))
        torch.testing.assert_close(jf(x), _scaled_exp_again(x))
    (region,) = [r for r in CACHE.entries.values() if "prims_mul(v0, 2.625)" in r.source and r.graph]
    with torch.no_grad():
        assert region.graph.admits((x,))
        assert not region.graph.admits((torch.randn(10)[::2],))
        with torch.autocast("cpu"):
            assert not region.graph.admits((x,))
    assert not region.graph.admits((x,))  # (grad mode on)
    with torch.inference_mode():
        assert not region.graph.admits((x,))


def _cos_rows(x):
    return (x.cos() * 1.375).exp().sum(-1)


def test_a_region_with_symbolic_sizes_runs_the_frame_s_entry_where_its_guards_pass():
    # A region over symbolic sizes runs the code torch.compile's frame ran for its last call, where the entry's
    # guards (torch.compile's own) pass (executors/inductor/direct.py, `Direct`); a size they exclude (1)
    # goes through the frame, which compiles again.
    jf = minijit.jit(_cos_rows, executors=["inductor"], cache="symbolic values")
    through_frame = []
    with torch.no_grad():
        for n in (5, 7, 9, 1, 6, 11, 12):
            x = torch.randn(3, n)
            torch.testing.assert_close(jf(x), _cos_rows(x))
            if n == 7:
                (region,) = [r for r in CACHE.entries.values() if "1.375)" in r.source]
                assert region.graph is None and region.direct is not None
                region.compiled = _counted(region.compiled, through_frame)
    assert len(through_frame) == 2  # (sizes 1, then 6 back to the first entry: 9, 11 and 12 ran without it)
