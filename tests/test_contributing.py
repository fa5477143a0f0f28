"""docs/contributing.md stays true: its runnable example registers an algorithm through the public
registry, which dispatch, explain() and the tuner then treat as one of dnnkit's own; the pieces its
three-file recipe names exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import dnnkit
from dnnkit.algos import conv_cpu

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "contributing.md"

pytestmark = pytest.mark.skipif(not DOC.exists(), reason="docs/ is not beside the tests (an installed copy)")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_outside_example_runs(capsys):
    section = _section(DOC.read_text(), "## An algorithm from outside the package")
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "no python example in the section"
    before = [a.name for a in dnnkit.algos.algorithms("conv2d_fwd", "cpu")]
    exec(compile("\n".join(blocks), str(DOC), "exec"), {"__name__": "contributing_example"})
    out = capsys.readouterr().out
    assert "einsum_conv" in out and "ok" in out
    assert [a.name for a in dnnkit.algos.algorithms("conv2d_fwd", "cpu")] == before  # unregistered again


def test_the_recipe_names_what_exists():
    header = (ROOT / "csrc" / "conv" / "kernels.h").read_text()
    for name in ("#define CONV_KERNEL", "#define CONV_RUNS", "struct ConvCall", "const void* a0", "void* ws",
                 "index_t chunk"):
        assert name in header, name
    kernel_files = [p for p in (ROOT / "csrc" / "conv").glob("*.cpp") if "CONV_KERNEL(" in p.read_text()]
    assert len(kernel_files) >= 5
    registered = {(a.direction, a.kernel) for a in conv_cpu.ALGORITHMS if isinstance(a, conv_cpu._CpuConv) and a.kernel}
    for direction, kernel in registered:
        dnnkit._cpu.conv_workspace_elems(direction, kernel, (1, 1, 4, 4, 1, 3, 3, 4, 4, 1, 1, 1, 1, 1, 1, 1), 1, 4)
    assert set(conv_cpu.ALGORITHMS) <= set(dnnkit.algos.all_algorithms())
