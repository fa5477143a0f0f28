"""GPU dispatch without a GPU: which GPU GEMM algorithm supports a problem and why not, the rules that
choose among them untuned (by how many tiles of C the GPU's SMs get), split-K's slices and workspace,
explain() on GPU descriptors, the element-wise kernels' launch shapes, and the GEMM kernels' loaders
(which thread stores what to shared memory). Nothing here launches a kernel."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnkit
from dnnkit import algos
from dnnkit.algos import gemm_cuda
from dnnkit.dispatch import choose
from dnnkit.problem import GemmProblem


@pytest.fixture
def sms(monkeypatch):
    monkeypatch.setattr(gemm_cuda, "sm_count", lambda: 132)
    dnnkit.dispatch._plans.clear()
    yield 132
    dnnkit.dispatch._plans.clear()


def g(m, n, k, **kw):
    return GemmProblem(m, n, k, device="cuda", **kw)


@pytest.mark.parametrize("shape, chosen", [
    ((4096, 4096, 4096), "gemm_tiled_128x128"),   # 1024 tiles of 128x128: a wave and more
    ((1024, 1024, 1024), "gemm_tiled_64x64"),     # 64 tiles of 128, 256 of 64
    ((8, 1000, 512), "gemm_tiled_32x32"),         # 16 tiles of 64: too few; depth too short to split
    ((64, 64, 8192), "gemm_splitk"),              # one tile of 64 over a long depth
    ((3, 5, 7), "gemm_tiled_32x32"),
])
def test_rules_choose_by_how_the_tiles_fill_the_gpu(sms, shape, chosen):
    assert choose(g(*shape)).name == chosen


def test_every_gpu_algorithm_is_registered_in_rule_order():
    names = [a.name for a in algos.algorithms("gemm", "cuda")]
    assert names == ["gemm_tf32", "gemm_tiled_128x128", "gemm_tiled_64x64", "gemm_splitk", "gemm_tiled_32x32"]
    assert all(a.backend == "cuda" and a.op == "gemm" for a in algos.algorithms("gemm", "cuda"))


def test_supports_says_why_not(sms):
    tiled = algos.get("gemm", "cuda", "gemm_tiled_64x64")
    split = algos.get("gemm", "cuda", "gemm_splitk")
    assert tiled.supports(GemmProblem(8, 8, 8)) == "runs on the GPU, the problem is on cpu"
    assert "2^31" in tiled.supports(g(2**16, 2**16, 2))
    assert "row blocks" in tiled.supports(g(65536 * 64 + 1, 1, 1))
    assert split.supports(g(4, 4, 511)) == "k = 511: fewer than two slices of 256"
    assert split.supports(g(4, 4, 512)) is None
    assert tiled.supports(g(1, 1, 1, dtype="float64")) is None


def test_split_k_slices_and_workspace(sms):
    split = algos.get("gemm", "cuda", "gemm_splitk")
    p = g(64, 64, 8192)
    assert split.splits(p) == 32  # one tile: as many slices as allowed (the SMs' worth, at most 32)
    assert split.workspace_bytes(p) == 32 * 64 * 64 * 4
    assert split.splits(g(64, 64, 600)) == 2  # slices of 256 at least
    # a workspace limit below its need leaves the tiled kernels
    assert choose(p, workspace_limit=1024).name == "gemm_tiled_32x32"


def test_explain_a_gpu_descriptor(sms):
    e = dnnkit.explain("m64n64k8192_f32_cuda")
    assert e.problem.device == "cuda"
    assert [c.algorithm for c in e if c.chosen] == ["gemm_splitk"]
    text = str(e)
    assert "gemm_tiled_128x128" in text and "rule: fewer 128x128 tiles" in text


def test_tf32_only_where_allowed(sms):
    p = g(4096, 4096, 4096)
    assert choose(p).name == "gemm_tiled_128x128"
    assert choose(p, "gemm_tf32").name == "gemm_tf32"  # naming it allows it
    dnnkit.set_allow_tf32(True)
    try:
        assert choose(p).name == "gemm_tf32"
        assert choose(g(64, 64, 64, dtype="float64")).name != "gemm_tf32"
    finally:
        dnnkit.set_allow_tf32(False)
    with pytest.raises(TypeError, match="set_allow_tf32: allowed must be a bool"):
        dnnkit.set_allow_tf32(1)


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 100))
def test_element_wise_launches_cover_the_array_once_and_no_lone_block_runs_past_it(rows, cols):
    """Every (row, column) falls to one thread (the kernels' index arithmetic, block sizes at full width);
    a block is narrower or shorter than the full one only where it is the dimension's one block, and then
    exactly as wide or tall as the array."""
    from dnnkit.kernels import eltwise, rnn

    (gx, gy), (bx, by) = rnn.step_grid(rows, cols)
    cells = [(y * rnn.STEP_Y + ty, x * rnn.STEP_X + tx)
             for y in range(gy) for x in range(gx) for ty in range(by) for tx in range(bx)]
    inside = [c for c in cells if c[0] < rows and c[1] < cols]
    assert len(inside) == len(set(inside)) == rows * cols
    assert (bx, by) == (rnn.STEP_X if gx > 1 else cols if cols < rnn.STEP_X else rnn.STEP_X,
                        rnn.STEP_Y if gy > 1 else min(rows, rnn.STEP_Y))
    sx, sy = eltwise.sum_block(rows, cols)
    assert sx == min(cols, eltwise.SUM_COLUMNS) and sy == min(rows, eltwise.SUM_ROWS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemm_cuda, "sm_count", lambda: 132)
        grid, threads = gemm_cuda._eltwise_grid(rows * cols)
    covered = {b * eltwise.ELTWISE_THREADS + t for b in range(grid) for t in range(threads)}
    assert grid * eltwise.ELTWISE_THREADS >= rows * cols and set(range(rows * cols)) <= covered
    assert threads == eltwise.ELTWISE_THREADS or (grid == 1 and threads == rows * cols)


class _Stores:
    def __init__(self):
        self.at = []

    def __setitem__(self, index, value):
        self.at.append(index)


@pytest.mark.parametrize("tile_name", ["128x128", "64x64", "32x32", "tf32"])
@pytest.mark.parametrize("operand, trans", [("a", False), ("a", True), ("b", False), ("b", True)])
def test_gemm_loaders_fill_each_tile_once_and_store_it_without_bank_conflicts(tile_name, operand, trans):
    """The GEMM kernels' loaders (their generated source, run for every thread of a block): every (depth,
    row) of an operand's tile is stored to shared memory once a step; each store instruction of a warp
    falls in 32 distinct banks (4-byte words) in the 128x128 and 64x64 tiles, at most two-way in the
    others (runs of 8 depths: 32x32, TF32)."""
    from dnnkit.kernels import gemm as kg
    from dnnkit.kernels import gemm_tf32

    tile, pad = (gemm_tf32.TILE, gemm_tf32.PAD) if tile_name == "tf32" else (kg.TILES[tile_name], kg.PAD)
    width = tile.bm if operand == "a" else tile.bn
    code = compile("\n".join(kg._loads(tile, operand, trans, "put", "0")), "<put>", "exec")
    seen, banks = [], {}
    for tid in range(tile.threads):
        stores = _Stores()
        scope = {"int32": int, "u32": int, "tid": tid, "sA": stores, "sB": stores}
        scope.update({f"v{operand}{i}": 0.0 for i in range(tile.bk * width // tile.threads)})
        exec(code, scope)  # noqa: S102 - the kernels' own generated source
        for i, (buf, depth, row) in enumerate(stores.at):
            assert buf == 0 and 0 <= depth < tile.bk and 0 <= row < width
            seen.append((depth, row))
            word = depth * (width + pad) + row
            banks.setdefault((tid // 32, i, word % 32), set()).add(word)
    assert sorted(seen) == [(d, r) for d in range(tile.bk) for r in range(width)]
    assert max(len(words) for words in banks.values()) <= (1 if tile_name in ("128x128", "64x64") else 2)


class _Operand:
    """A 2-D operand whose element reads are recorded: a[i] is row i, row[j] records (i, j)."""

    def __init__(self):
        self.reads = []

    def __getitem__(self, i):
        reads = self.reads

        class Row:
            def __getitem__(self, j):
                reads.append((i, j))
                return 0.0

        return Row()


@pytest.mark.parametrize("tile_name", ["128x128", "64x64", "32x32", "tf32"])
@pytest.mark.parametrize("operand, trans", [("a", False), ("a", True), ("b", False), ("b", True)])
def test_gemm_loaders_read_each_tile_once_in_whole_sectors(tile_name, operand, trans):
    """The GEMM kernels' loaders (their generated global loads, run for every thread of a block inside the
    operand): every element of an operand's tile is read once a step; a warp's reads fill the 32-byte
    sectors they touch (a float32 operand whose rows start 32-byte aligned); and where the operand's rows
    run along the tile's rows (the transposed layouts) with 8 threads or more on a depth (a sector's
    worth: all but the 32x32 tile's), each load instruction of a warp reads 4 whole sectors."""
    from dnnkit.kernels import gemm as kg
    from dnnkit.kernels import gemm_tf32

    tile = gemm_tf32.TILE if tile_name == "tf32" else kg.TILES[tile_name]
    width = tile.bm if operand == "a" else tile.bn
    count = width * tile.bk // tile.threads
    code = compile("\n".join(kg._loads(tile, operand, trans, "fetch")), "<fetch>", "exec")
    ld, big = 4096, 10**6  # elements a stored row; sizes that put the tile inside the operand
    rows_along_tile = trans if operand == "a" else not trans  # the stored operand's rows: the tile's rows
    seen, warp_sectors, insn_sectors = [], {}, {}
    for tid in range(tile.threads):
        arr = _Operand()
        scope = {"int32": int, "u32": int, "u64": int, "tid": tid, operand: arr, "zero": 0.0, "bm": 0, "bn": 0,
                 "k0": 0, "kend": big, "m32": big, "n32": big}
        exec(code, scope)  # noqa: S102 - the kernels' own generated source
        assert len(arr.reads) == count
        for i, (r, c) in enumerate(arr.reads):
            seen.append((c, r) if rows_along_tile else (r, c))  # (tile row, depth)
            sector = (r * ld + c) * 4 // 32
            warp_sectors.setdefault(tid // 32, set()).add(sector)
            insn_sectors.setdefault((tid // 32, i), set()).add(sector)
    assert sorted(seen) == sorted((r, d) for r in range(width) for d in range(tile.bk))
    warp_bytes = 32 * count * 4
    assert all(len(s) == warp_bytes // 32 for s in warp_sectors.values())
    if rows_along_tile and width // count >= 8:
        assert all(len(s) == 4 for s in insn_sectors.values())
