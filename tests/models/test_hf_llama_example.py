"""examples/hf_llama.py runs: a tiny Hugging Face Llama trains under minijit.jit with eager's losses."""

import importlib.util
import pathlib
import sys

import pytest

_spec = importlib.util.spec_from_file_location(
    "hf_llama_example", pathlib.Path(__file__).parents[2] / "examples" / "hf_llama.py")
hf_llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_llama)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_example_trains_with_eager_losses_and_prints_its_trace(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["hf_llama.py", "--steps", "2", "--lines", "3"])
    hf_llama.main()  # asserts the losses equal eager's
    out = capsys.readouterr().out
    assert "step 1: loss eager" in out and "the losses equal eager PyTorch's" in out
    trace_lines = out.split("its first 3:\n", 1)[1].splitlines()[:3]
    assert trace_lines[1].startswith("def llamaforcausallm_forward(") and "input_ids" in trace_lines[1]
    assert "1 hit(s), 1 miss(es)" in out  # the second step reused the first step's trace

