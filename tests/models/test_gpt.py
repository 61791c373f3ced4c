"""The GPT example under minijit.jit: training steps and symbolic sequence lengths match eager."""

import importlib.util
import pathlib
import sys

import torch

import minijit

_spec = importlib.util.spec_from_file_location("gpt_example", pathlib.Path(__file__).parents[2] / "examples" / "gpt.py")
gpt = importlib.util.module_from_spec(_spec)
sys.modules["gpt_example"] = gpt  # dataclasses look their module up while the file runs
_spec.loader.exec_module(gpt)


def test_training_steps_match_eager():
    # train() asserts logits and losses equal eager at every step, and gradients drive the same updates.
    gpt.train(steps=3, verbose=False)


def test_one_symbolic_trace_serves_several_sequence_lengths():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig()).eval()
    jmodel = minijit.jit(model, cache="symbolic values")
    with torch.no_grad():
        for seq in (8, 12, 16, 5):
            idx = torch.randint(0, 64, (2, seq))
            torch.testing.assert_close(jmodel(idx)[0], model(idx)[0], rtol=1e-4, atol=1e-5)
    info = minijit.cache_info(jmodel)
    assert (info.misses, info.hits) == (1, 3)


def test_changing_a_config_attribute_the_trace_read_retraces():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig()).eval()
    jmodel = minijit.jit(model)
    idx = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        jmodel(idx)
        for block in model.h:
            block.attn.n_head = 2  # the head count is read in forward: a different computation
        torch.testing.assert_close(jmodel(idx)[0], model(idx)[0])
    assert minijit.cache_info(jmodel).misses == 2
