"""docs/ops.md is what scripts/ops_doc.py generates (every torch op: decomposed, opaque or refused)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ops_doc.py"


def _ops_doc():
    spec = importlib.util.spec_from_file_location("ops_doc", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_ops_md_is_up_to_date():
    ops_doc = _ops_doc()
    written = ops_doc.DOC.read_text()
    if f"for torch {torch.__version__};" not in written:
        pytest.skip(f"docs/ops.md was generated for another torch than {torch.__version__}")
    assert ops_doc.generate() == written, "docs/ops.md is out of date: run python scripts/ops_doc.py"


def test_every_op_is_classified_with_a_reason_where_refused():
    ops_doc = _ops_doc()
    assert ops_doc.classify("torch", "nonzero", torch.nonzero)[0] == "read"
    assert ops_doc.classify("torch", "is_nonzero", torch.is_nonzero)[0] == "refused"
    assert ops_doc.classify("torch", "add", torch.add) == ("decomposed", "ltorch.add")
    assert ops_doc.classify("torch", "logcumsumexp", torch.logcumsumexp) == ("opaque", "")
    assert ops_doc.classify("torch.Tensor", "squeeze_", torch.Tensor.squeeze_)[0] == "refused"
