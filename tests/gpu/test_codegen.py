"""Code generation, checked without a GPU: every kernel variant (GEMM tile x dtype, split-K, the
element-wise and reduction kernels) compiled by Numba-CUDA to PTX for sm_80 and sm_90 and linked to a
cubin by nvJitLink: no local memory (no spills, no local arrays), registers and shared memory within
what its launch needs, and in the SASS of the GEMM kernels' main loop, fused multiply-adds the larger
share of its instructions and 128-bit shared-memory loads where the tile is meant to load them (and
tensor-core HMMA in the TF32 kernel's)."""
from __future__ import annotations

import pytest

pytest.importorskip("numba.cuda")
pytest.importorskip("cuda.core")

from dnnkit.kernels import codegen  # noqa: E402

ARCHS = {"sm_80": (8, 0), "sm_90": (9, 0)}
VARIANTS = codegen.variants()


@pytest.fixture(scope="module")
def built():
    cache = {}

    def get(v, arch):
        if (v.name, arch) not in cache:
            cache[v.name, arch] = codegen.link(codegen.compile_ptx(v, ARCHS[arch]), arch)
        return cache[v.name, arch]

    return get


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("v", VARIANTS, ids=[v.name for v in VARIANTS])
def test_resources(v, arch, built):
    r = built(v, arch)
    assert r.local_bytes == 0 and r.spill_stores == 0 and r.spill_loads == 0, (v.name, r)
    assert 0 < r.registers <= 255 and r.registers * v.threads <= codegen.REGISTERS_PER_SM, (v.name, r.registers)
    assert r.shared_bytes <= codegen.STATIC_SHARED_PER_BLOCK
    want = v.launch_bounds[1] if len(v.launch_bounds) > 1 else 1  # the resident blocks it is built for
    assert r.blocks_per_sm(v.threads, arch) >= want, (v.name, r.registers)


@pytest.mark.skipif(codegen.cuobjdump() is None, reason="cuobjdump and nvdisasm are not installed")
@pytest.mark.parametrize("v", [v for v in VARIANTS if v.main_loop_fma], ids=lambda v: v.name)
def test_sass_main_loop(v, built):
    prof = codegen.sass_profile(codegen.sass(built(v, "sm_90").cubin))
    assert prof.local == 0
    # The main loop is a whole depth step, its products written out. FMAs are at least half of its
    # instructions in float32 (the rest: the shared loads, 128 bits a time, and the next step's global
    # loads, their bounds tests and their stores), three quarters in the 128x128 tile built for large
    # products; float64 takes two 128-bit loads for what one brings in float32. Index arithmetic in int64,
    # or with negative-index wrapping, falls below this.
    floor = 0.45 if "float64" in v.name else 0.75 if v.name.startswith("gemm_128x128") else 0.5
    assert prof.loop_ffma >= 16 and prof.loop_ffma_share >= floor, (v.name, prof)
    if v.wide_loads:
        assert prof.lds.get("LDS.128", 0) > 0 and "LDS" not in prof.lds, (v.name, prof.lds)
    # The next step's stores to shared memory come after this step's products begin: its global loads,
    # issued before them, have the products' time to arrive.
    assert prof.loop_early_stores == 0, (v.name, prof)


@pytest.mark.skipif(codegen.cuobjdump() is None, reason="cuobjdump and nvdisasm are not installed")
@pytest.mark.parametrize("v", [v for v in VARIANTS if v.inner_loop_fma], ids=lambda v: v.name)
def test_sass_persistent_product_loop(v, built):
    """The persistent RNN's product loop (its innermost loop with FMAs: depth steps of W_hh rows from
    shared memory times the staged h): FMAs at least half its instructions where a lane's tile has 8 or
    more of them, h read 128 bits a time where the batch tile is 4 wide or more (float32)."""
    prof = codegen.sass_profile(codegen.sass(built(v, "sm_90").cubin))
    assert prof.local == 0 and prof.inner_ffma >= codegen.rnn_persistent.UNROLL, prof
    if prof.inner_ffma >= 8 * codegen.rnn_persistent.UNROLL:
        assert prof.inner_ffma / prof.inner_instructions >= 0.5, prof
    if v.wide_loads:
        assert dict(prof.inner_lds).get("LDS.128", 0) > 0, prof


@pytest.mark.skipif(codegen.cuobjdump() is None, reason="cuobjdump and nvdisasm are not installed")
@pytest.mark.parametrize("v", [v for v in VARIANTS if v.tensor_cores], ids=lambda v: v.name)
def test_sass_tensor_cores(v, built):
    """The TF32 kernel's main loop is mma.sync: 8 HMMA.1688.F32.TF32 a step of 8 of the depth."""
    text = codegen.sass(built(v, "sm_90").cubin)
    prof = codegen.sass_profile(text)
    assert "HMMA.1688.F32.TF32" in text and prof.loop_mma >= 8 and prof.local == 0, prof
    assert prof.loop_early_stores == 0, prof


def test_sass_profile_reads_cuobjdump_output():
    text = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        "        /*0010*/                   LDS.128 R4, [R2] ;",
        "        /*0020*/                   FFMA R8, R4, R5, R8 ;",
        "        /*0030*/                   FFMA R9, R4, R6, R9 ;",
        "        /*0040*/               @P0 BRA 0x10 ;",
        "        /*0050*/                   STL [R1], R8 ;",
        "        /*0060*/                   EXIT ;",
    ])
    prof = codegen.sass_profile(text)
    assert (prof.instructions, prof.ffma, prof.local, prof.lds) == (7, 2, 1, {"LDS.128": 1})
    assert (prof.loop_instructions, prof.loop_ffma, prof.loop_early_stores) == (4, 2, 0)
    # A store to shared memory in the loop before its first FMA is counted.
    early = codegen.sass_profile(text.replace("LDS.128 R4, [R2]", "STS [R2], R4"))
    assert early.loop_early_stores == 1
