"""The `dnnkit` command line, run as a separate process (`python -m dnnkit` and the console script)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import dnnkit


def run(*args, module=True):
    cmd = [sys.executable, "-m", "dnnkit", *args] if module else [*args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_info_json():
    r = run("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert {"version", "isa_active", "threads"} <= info.keys()
    assert info["version"] == dnnkit.__version__
    assert info["isa_active"] in ("ref", "avx2", "avx512")
    assert isinstance(info["threads"], int) and info["threads"] >= 1


def test_info_text():
    r = run("info")
    assert r.returncode == 0, r.stderr
    assert "version" in r.stdout and "ukernel float32" in r.stdout


def test_explain_console_script():
    exe = shutil.which("dnnkit")
    if exe is None:
        pytest.skip("the dnnkit console script is not on PATH (package not installed)")
    r = run(exe, "explain", "m8n8k8_f32", module=False)
    assert r.returncode == 0, r.stderr
    assert "blocked_gemm" in r.stdout and "m8n8k8_f32" in r.stdout


def test_explain_module():
    r = run("explain", "m8n8k8_f32")
    assert r.returncode == 0, r.stderr
    assert "blocked_gemm" in r.stdout


def test_explain_garbage_is_a_one_line_error():
    r = run("explain", "garbage")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dnnkit: error:") and "garbage" in lines[0]
    assert "Traceback" not in r.stderr


def test_no_command_prints_help():
    r = run()
    assert r.returncode != 0
    assert "usage" in r.stdout.lower()
