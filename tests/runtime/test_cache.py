"""Cache hits and misses as inputs change; a changed input is never a wrong hit."""

import functools

import torch

import minijit


def _f(x, y, scale):
    return (x * y + scale).sum(dim=0)


def _check(jf, *args):
    torch.testing.assert_close(jf(*args), _f(*args))


def test_same_metadata_hits_and_changes_miss():
    jf = minijit.jit(_f, cache="constant values")
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    _check(jf, x, y, 2.0)
    _check(jf, torch.randn(4, 3), torch.randn(4, 3), 2.0)
    info = minijit.cache_info(jf)
    assert (info.hits, info.misses) == (1, 1)

    changes = [
        (torch.randn(5, 3), torch.randn(5, 3), 2.0),                      # shape
        (x.double(), y.double(), 2.0),                                    # dtype
        (x, y, 3.0),                                                      # Python value
        (x, y, 2),                                                        # Python type (2 == 2.0)
        (x.requires_grad_(True), y, 2.0),                                 # requires_grad
    ]
    for i, args in enumerate(changes, start=2):
        _check(jf, *args)
        assert minijit.cache_info(jf).misses == i
    assert minijit.cache_info(jf).entries == len(changes) + 1


def test_every_entry_is_reused():
    jf = minijit.jit(_f, cache="constant values")
    shapes = [(2, 3), (4, 3), (2, 3), (4, 3)]
    for s in shapes:
        _check(jf, torch.randn(s), torch.randn(s), 1.0)
    info = minijit.cache_info(jf)
    assert (info.hits, info.misses, info.entries) == (2, 2, 2)


def test_no_caching_traces_every_call():
    jf = minijit.jit(_f, cache="no caching")
    for _ in range(3):
        _check(jf, torch.randn(2, 2), torch.randn(2, 2), 1.0)
    assert minijit.cache_info(jf).misses == 3
    assert minijit.cache_info(jf).entries == 0


def test_kwargs_and_nested_arguments():
    def g(xs, *, scale=1.0):
        return xs[0] * scale + xs[1]

    jf = minijit.jit(g, cache="constant values")
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(jf([a, b], scale=2.0), g([a, b], scale=2.0))
    torch.testing.assert_close(jf((a, b), scale=2.0), g((a, b), scale=2.0))
    torch.testing.assert_close(jf([a, b], scale=3.0), g([a, b], scale=3.0))
    assert minijit.cache_info(jf).misses == 3
    header = minijit.last_traces(jf)[-1].python().splitlines()[0]
    assert header == "def g(xs, xs_1):"


def test_slice_arguments_are_keys():
    # Slices are unhashable before Python 3.12: the key holds their bounds.
    jf = minijit.jit(lambda x, key: x[key])
    x = torch.randn(4, 5)
    for key in [(slice(1, None), 2), (slice(1, None), 2), (slice(None, 3), 2)]:
        torch.testing.assert_close(jf(x, key), x[key])
    info = minijit.cache_info(jf)
    assert (info.hits, info.misses) == (1, 2)


SCALE = 2.0


def _uses_global(x):
    return x * SCALE


def test_a_changed_global_is_a_miss_with_its_reason():
    global SCALE
    jf = minijit.jit(_uses_global)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(jf(x), x * 2.0)
        torch.testing.assert_close(jf(x), x * 2.0)
        SCALE = 3.0
        torch.testing.assert_close(jf(x), x * 3.0)
        info = minijit.cache_info(jf)
        assert (info.hits, info.misses) == (1, 2)
        assert info.miss_reasons[1] == "global SCALE = 2.0 changed"
        SCALE = 2.0
        torch.testing.assert_close(jf(x), x * 2.0)  # the first entry holds again
        assert minijit.cache_info(jf).hits == 2
    finally:
        SCALE = 2.0


def test_a_changed_closure_value_is_a_miss():
    def make(k):
        def f(x):
            return x + k
        return f

    f = make(1)
    jf = minijit.jit(f)
    x = torch.zeros(2)
    torch.testing.assert_close(jf(x), x + 1)
    f.__closure__[0].cell_contents = 5
    torch.testing.assert_close(jf(x), x + 5)
    assert minijit.cache_info(jf).misses == 2


def test_a_jitted_function_carries_the_names_functools_wraps_gives():
    def scaled(x):
        """Doubled."""
        return x * 2

    scaled.unit = "m"
    jf = minijit.jit(scaled)

    def reference():
        pass

    functools.update_wrapper(reference, scaled)
    for name in (*functools.WRAPPER_ASSIGNMENTS, "__wrapped__", "unit"):
        assert getattr(jf, name) == getattr(reference, name), name
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), scaled(x))
