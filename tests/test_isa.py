"""Instruction-set levels: detection, DNNKIT_ISA's cap, the module chosen for a level, what each module's
machine code may contain, and how the API reports them (info, explain, errors)."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dnnkit
from dnnkit import _cpu

LEVELS = ("ref", "avx2", "avx512", "amx")
MODULE_OF_LEVEL = {"ref": "ref", "avx2": "avx2", "avx512": "avx512", "amx": "avx512"}
CPU_LEVELS = LEVELS[: LEVELS.index(_cpu.cpu_level()) + 1]


def run_python(code: str, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=120)


def test_levels_are_consistent():
    idx = LEVELS.index
    assert idx(_cpu.max_level()) == min(idx(_cpu.cpu_level()), idx(_cpu.built_level()), idx(_cpu.level_limit()))
    assert _cpu.detected_isa() == ("avx512" if _cpu.max_level() == "amx" else _cpu.max_level())
    assert _cpu.amx_available() == (_cpu.max_level() == "amx")
    assert _cpu.__name__ == f"dnnkit._cpu_{MODULE_OF_LEVEL[_cpu.max_level()]}"
    info = dnnkit.info()
    assert info["isa_detected"] == _cpu.cpu_level() and info["isa_max"] == _cpu.max_level()
    assert info["module"] == _cpu.__name__ and info["isa_active"] == _cpu.active_isa()


def test_cpu_level_matches_the_os_view():
    """On Linux the kernel lists, in /proc/cpuinfo, only the vector extensions it saves the state of."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo")
    want = "ref"
    if {"avx2", "fma", "f16c"} <= set(flags):
        want = "avx2"
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(flags):
            want = "avx512"
            if {"amx_tile", "amx_bf16", "avx512_bf16"} <= set(flags):
                want = "amx"
    got = _cpu.cpu_level()
    # amx needs the kernel's grant of the tile data as well; where it is refused the CPU runs avx512.
    assert got == want or (want == "amx" and got == "avx512")


@pytest.mark.parametrize("level", CPU_LEVELS)
def test_dnnkit_isa_caps_the_level(level):
    """DNNKIT_ISA picks the module of that level (never one above the CPU's) and its kernels compute."""
    r = run_python("import numpy as np, dnnkit\n"
                   "from dnnkit import _cpu\n"
                   "a = np.arange(12, dtype=np.float32).reshape(3, 4)\n"
                   "assert (dnnkit.gemm(a, a.T) == a.astype(np.float64) @ a.T).all()\n"
                   "print(_cpu.__name__, _cpu.max_level(), _cpu.active_isa(), _cpu.amx_available())",
                   DNNKIT_ISA=level)
    assert r.returncode == 0, r.stderr
    module, max_level, active, amx = r.stdout.split()
    assert LEVELS.index(max_level) <= LEVELS.index(level) and module == f"dnnkit._cpu_{MODULE_OF_LEVEL[max_level]}"
    if level != "amx" and _module_path(level):  # the build has this level's module, and the CPU runs it
        assert max_level == level
    assert active == ("avx512" if max_level == "amx" else max_level) and amx == str(max_level == "amx")


def test_an_unknown_dnnkit_isa_is_ignored_with_a_warning():
    code = "import dnnkit\nfrom dnnkit import _cpu\nprint(_cpu.max_level())"
    r = run_python(code, DNNKIT_ISA="avx9000")
    assert r.returncode == 0, r.stderr
    assert "DNNKIT_ISA='avx9000'" in r.stderr and "ignored" in r.stderr
    assert r.stdout.strip() == run_python(code, DNNKIT_ISA="").stdout.strip()  # as with no cap


def test_set_isa_refuses_what_the_kernels_may_not_use():
    for isa in ("avx2", "avx512"):
        if LEVELS.index(isa) > LEVELS.index(_cpu.detected_isa()):
            with pytest.raises(ValueError, match=f"set_isa: .*{isa}"):
                _cpu.set_isa(isa)
    with pytest.raises(ValueError, match="set_isa: isa must be one of"):
        _cpu.set_isa("sse9")
    if not _cpu.amx_available():
        with pytest.raises(ValueError, match="set_amx: "):
            dnnkit.set_amx(True)


def test_explain_names_where_the_products_run():
    text = str(dnnkit.explain("m512n512k512_f32"))
    assert text.splitlines()[1].startswith("  on ")
    if _cpu.amx_enabled() and _cpu.active_isa() == "avx512":
        assert "AMX tiles: the blocked GEMM runs this 512 x 512 x 512 product on them" in text
        assert "too small for the AMX tiles" in str(dnnkit.explain("m16n512k512_f32"))
    else:
        assert f"{_cpu.active_isa()} FMA kernels" in text


# ---- What each module's machine code may contain. A module runs only on CPUs of its level or above,
# so it may hold no instruction of a level above its own: the baseline module no VEX-encoded instruction
# at all, the AVX2 module none of AVX-512's (EVEX: zmm registers, opmask registers, registers 16-31).
_ABOVE = {
    "ref": re.compile(r"^v[a-z]|%[yz]mm|%k[0-7]"),
    "avx2": re.compile(r"%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{"),
}


def _module_path(level):
    spec = importlib.util.find_spec(f"dnnkit._cpu_{level}")  # located, not imported: it may not run here
    return spec.origin if spec else None


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
@pytest.mark.parametrize("level", sorted(_ABOVE))
def test_a_module_holds_no_instruction_above_its_level(level):
    path = _module_path(level)
    if path is None:
        pytest.skip(f"this build has no {level} module")
    if "x86" not in subprocess.run(["objdump", "-f", path], capture_output=True, text=True).stdout:
        pytest.skip("not an x86 build")
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path], capture_output=True, text=True,
                          check=True).stdout
    bad, func = [], "?"
    for line in dump.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            func = m.group(1)
        elif "\t" in line:
            insn = re.sub(r"<.*>", "", line.split("\t", 1)[1]).strip()  # without the symbol of a target
            if _ABOVE[level].search(insn):
                bad.append(f"{func}: {insn}")
    assert not bad, f"{len(bad)} instructions above {level} in {os.path.basename(path)}, e.g.\n" + "\n".join(bad[:10])


def test_the_detection_module_is_baseline_code():
    """dnnkit._cpu_detect runs before any level is known: baseline code only (checked like the ref module)."""
    if shutil.which("objdump") is None:
        pytest.skip("needs objdump (binutils)")
    path = _module_path("detect")
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True).stdout
    if "x86" not in subprocess.run(["objdump", "-f", path], capture_output=True, text=True).stdout:
        pytest.skip("not an x86 build")
    insns = [ln.split("\t", 1)[1].strip() for ln in dump.splitlines() if "\t" in ln and not ln.endswith(">:")]
    assert not [i for i in insns if _ABOVE["ref"].search(i)]


def test_every_level_gives_the_same_products(tmp_path):
    """The modules of every level this CPU runs compute the same GEMM to float32 accuracy."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((50, 90)).astype(np.float32)
    b = rng.standard_normal((90, 50)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    ref = a.astype(np.float64) @ b
    for level in CPU_LEVELS:
        r = run_python("import sys, numpy as np, dnnkit\n"
                       "d = sys.argv[1]\n"
                       "np.save(d + '/c.npy', dnnkit.gemm(np.load(d + '/a.npy'), np.load(d + '/b.npy')))",
                       str(tmp_path), DNNKIT_ISA=level)
        assert r.returncode == 0, r.stderr
        c = np.load(tmp_path / "c.npy")
        assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-6, level
