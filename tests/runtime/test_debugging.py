"""Explained re-traces, retrace warnings, and looking at traces with show / show_diff."""

import io
import warnings

import pytest
import torch

import minijit


def _f(x, scale):
    return (x * scale).exp().sum(dim=-1)


def test_cache_info_explains_each_miss_in_words():
    jf = minijit.jit(_f, cache="constant values")
    jf(torch.randn(4, 16), 2.0)
    jf(torch.randn(8, 16), 2.0)
    jf(torch.randn(8, 16), 3)
    jf(torch.randn(8, 16, dtype=torch.float64), 3)
    reasons = minijit.cache_info(jf).miss_reasons
    assert reasons == [
        "first call",
        "arg 'x': shape (8, 16) != (4, 16)",
        "arg 'scale': value 3 (int) != 2.0 (float)",
        "arg 'x': dtype float64 != float32",
    ]
    assert "miss 2: arg 'x': shape (8, 16) != (4, 16)" in str(minijit.cache_info(jf))


def test_grad_mode_and_requires_grad_changes_are_named():
    jf = minijit.jit(_f)
    x = torch.randn(2, 3)
    jf(x, 1.0)
    with torch.no_grad():
        jf(x, 1.0)
    jf(x.clone().requires_grad_(True), 1.0)
    reasons = minijit.cache_info(jf).miss_reasons
    assert reasons[1] == "torch.is_grad_enabled(): value False (bool) != True (bool)"
    assert reasons[2] == "arg 'x': requires_grad True != False"


def test_warns_on_every_retrace_after_n():
    jf = minijit.jit(_f, warn_retraces_after=2, cache="constant values")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jf(torch.randn(1, 3), 1.0)
        jf(torch.randn(2, 3), 1.0)
    with pytest.warns(minijit.RetraceWarning, match=r"miss 3\): arg 'x': shape \(3, 3\) != "):
        jf(torch.randn(3, 3), 1.0)


def test_retrace_warning_from_environment(monkeypatch):
    monkeypatch.setenv("MINIJIT_WARN_RETRACES", "0")
    jf = minijit.jit(_f)
    with pytest.warns(minijit.RetraceWarning, match="first call"):
        jf(torch.randn(2), 1.0)


def test_show_prints_plain_text_outside_a_terminal():
    jf = minijit.jit(_f)
    x = torch.randn(2, 3)
    jf(x, 2.0)
    out = io.StringIO()
    minijit.show(jf, file=out)
    assert out.getvalue().rstrip("\n") == str(minijit.last_traces(jf)[-1]).rstrip("\n")
    out = io.StringIO()
    minijit.show(jf, "capture", file=out)
    assert "ltorch.mul(x, 2.0)" in out.getvalue()
    out = io.StringIO()
    minijit.show(jf, "prologue", file=out)
    assert "x.shape == (2, 3)" in out.getvalue()
    assert "type(scale) is float and scale == 2.0" in out.getvalue()


def test_show_diff_shows_what_a_pass_changed():
    jf = minijit.jit(_f)
    jf(torch.randn(2, 3), 2.0)
    out = io.StringIO()
    minijit.show_diff(jf, "capture", "claim executors", file=out)
    text = out.getvalue()
    assert "-  t1 = ltorch.mul(x, 2.0)" in text and "+  t1 = torchex.mul(x, 2.0)" in text
    with pytest.raises(KeyError, match="no trace after a pass named 'nope'"):
        minijit.show_diff(jf, "capture", "nope", file=io.StringIO())
