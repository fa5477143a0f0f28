"""README.md as a newcomer reads it: its host example runs as written, and its test command is the one
.ci/run runs."""
from __future__ import annotations

import contextlib
import io
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _blocks(lang: str) -> list:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def test_the_host_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))  # a lookup writes nothing; this keeps it so
    (example,) = [b for b in _blocks("python") if "cupy" not in b]
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        exec(compile(example, str(README), "exec"), {})  # noqa: S102 - the project's own README
    assert "winograd_f4x4_3x3" in shown.getvalue() and "gemm_small_m" in shown.getvalue()
    assert not any(tmp_path.iterdir())


def test_the_test_command_is_what_ci_runs():
    commands = [line for block in _blocks("bash") for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1
    assert commands[0] in (ROOT / ".ci" / "run").read_text().splitlines()
