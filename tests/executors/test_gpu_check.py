"""scripts/gpu_check.py (issue 16): its checks on CPU through Triton's interpreter, and in full on CUDA.

On CPU each check runs at small sizes and compares minijit with eager as it will on the GPU
machine, so a check that is broken (or that no longer matches eager) fails here first.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'minijit[triton]' to run these tests)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")


def _load():
    spec = importlib.util.spec_from_file_location("minijit_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GPU_CHECK = _load()
# test_triton.py runs in the same session already; the other checks run here in-process.
IN_PROCESS = [name for name in GPU_CHECK.CHECKS if "test_triton" not in name]


@pytest.mark.parametrize("name", IN_PROCESS)
def test_check_passes_at_small_sizes(name):
    """On CUDA where there is one (Triton claims CUDA tensors there, not CPU ones), else the CPU."""
    detail = GPU_CHECK.CHECKS[name]("cuda" if torch.cuda.is_available() else "cpu", True)
    assert isinstance(detail, str) and detail


def test_close_catches_a_wrong_value():
    want = torch.ones(4)
    with pytest.raises(AssertionError, match="result"):
        GPU_CHECK.close(want.clone().index_fill_(0, torch.tensor([2]), float("nan")), want)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine, issue 16)")
def test_gpu_check_passes_on_cuda(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--log", str(tmp_path / "gpu_check.log")], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
