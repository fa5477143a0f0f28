"""The source tree's limits: no source file over 800 lines (one past it does several jobs, and splits by
job), and bench/RESULTS.md, which holds each benchmark's current table per machine (dated history lives in
bench/log/), under 1,500 lines."""
from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("setup.py", "python", "kernels", "csrc", "tests", "bench")
MAX_SOURCE_LINES = 800
MAX_RESULTS_LINES = 1500

if not (ROOT / "setup.py").is_file():  # the tests run from an installed copy, not the source tree
    pytest.skip("not a source tree", allow_module_level=True)


def _sources():
    for top in SOURCES:
        path = ROOT / top
        files = [path] if path.is_file() else path.rglob("*")
        yield from (f for f in files if f.suffix in (".py", ".cpp", ".h") and f.is_file())


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def test_no_source_file_over_800_lines():
    files = list(_sources())
    assert {"gemm.cpp", "dispatch.py", "test_tree.py"} <= {f.name for f in files}  # the walk found the sources
    long = {str(f.relative_to(ROOT)): n for f in files if (n := _lines(f)) > MAX_SOURCE_LINES}
    assert not long, long


def test_results_hold_current_tables_only():
    assert _lines(ROOT / "bench" / "RESULTS.md") < MAX_RESULTS_LINES
