"""Formatting a 0-dim tensor into a string (`f"tokens: {n}"`), as LLaVA's placeholder check does: its value is read
while tracing and checked by the trace, as `.item()` is; the string and what follows from it equal eager's."""

import pytest
import torch

import minijit


def _placeholder_check(ids, feats):
    n = (ids == 5).sum()
    message = f"tokens: {n}, features {feats.shape[0]}, ratio {n / 2:.2f}"
    if n != feats.shape[0]:
        raise ValueError(message)
    return feats * 2, message


def test_a_formatted_count_equals_eager_on_every_call():
    jf = minijit.jit(_placeholder_check)
    for ids in [[5, 5, 1], [5, 1, 5], [5, 5, 5], [1, 5, 5]]:
        ids, feats = torch.tensor(ids), torch.randn(2, 3)
        try:
            want = _placeholder_check(ids, feats)
        except ValueError as e:
            with pytest.raises(ValueError, match=str(e)):
                jf(ids, feats)
            continue
        got = jf(ids, feats)
        assert got[1] == want[1]
        torch.testing.assert_close(got[0], want[0])


def test_formatting_a_tensor_of_several_values_is_refused_by_name():
    jf = minijit.jit(lambda x: f"{x}")
    with pytest.raises(minijit.UnsupportedSyntaxError, match="formatting tensor"):
        jf(torch.randn(3))
