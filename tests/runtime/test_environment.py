"""minijit's environment variables: a value that means nothing is one clear error naming the variable."""

import os
import subprocess
import sys

import pytest
import torch

import minijit
from minijit.errors import EnvironmentVariableError

JUNK = [("MINIJIT_WARN_RETRACES", "abc"), ("MINIJIT_WARN_RETRACES", "-2"), ("MINIJIT_CHECK_TRACES", "yes"),
        ("MINIJIT_DUMP_TRACES", __file__)]


@pytest.mark.parametrize(("name", "value"), JUNK)
def test_junk_at_the_first_call_is_an_error_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvironmentVariableError, match=name):
        minijit.jit(lambda x: x + 1)(torch.ones(2))


@pytest.mark.parametrize(("name", "value"), JUNK[:1] + JUNK[2:])
def test_junk_at_import_is_an_error_naming_the_variable(name, value):
    env = {**os.environ, name: value}
    done = subprocess.run([sys.executable, "-c", "import minijit"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("minijit.errors.EnvironmentVariableError") and name in last


def test_a_dump_folder_that_cannot_be_made_is_an_error_naming_the_variable(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MINIJIT_DUMP_TRACES", str(blocker / "traces"))
    with pytest.raises(EnvironmentVariableError, match="MINIJIT_DUMP_TRACES"):
        minijit.jit(lambda x: x * 2)(torch.ones(2))


def test_good_values_work(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIJIT_WARN_RETRACES", "0")
    monkeypatch.setenv("MINIJIT_DUMP_TRACES", str(tmp_path / "dump"))
    jf = minijit.jit(lambda x: x * 2)
    with pytest.warns(minijit.RetraceWarning):
        torch.testing.assert_close(jf(torch.ones(2)), torch.ones(2) * 2)
    assert list((tmp_path / "dump").iterdir())
