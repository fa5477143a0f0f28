"""The persistent tuning cache: keys, corrupt and foreign stores, several processes at once."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from dnnkit.autotune import cache
from dnnkit.autotune.tuner import TuneRecord, TuneResult
from dnnkit.problem import ConvProblem, GemmProblem

P = ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1")


def _result(p=P, best="direct", t=1e-3):
    return TuneResult(p, [TuneRecord(best, "ok", median_s=t, workspace_bytes=0),
                          TuneRecord("fft", "pruned", reason="predicted slow")], 0.5)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    s = cache.default_store()
    yield s
    s.close()


def test_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path / "x"))
    assert cache.cache_path() == tmp_path / "x" / cache.FILENAME
    monkeypatch.delenv("DNNKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert cache.cache_path() == tmp_path / "xdg" / "dnnkit" / cache.FILENAME


def test_a_lookup_creates_no_file(store):
    assert store.get(P) is None
    assert not os.path.exists(store.path)


def test_round_trip_and_replacement(store):
    store.put(_result())
    got = store.get(P)
    assert got.source == "cache" and got.best.algorithm == "direct" and got.best.median_s == 1e-3
    assert got[1].status == "pruned" and got[1].median_s == float("inf")
    store.put(_result(best="im2col_gemm"))
    assert store.get(P).best.algorithm == "im2col_gemm"
    assert len(store.rows()) == 1


def test_the_key_is_the_problem_not_its_name(store):
    store.put(_result())
    named = ConvProblem.parse('mb2ic8ih12oc8oh12kh3ph1n"layer7"')
    assert store.get(named).best.algorithm == "direct"
    for other in (ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1", dtype="float64"),
                  ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1", direction="bwd_data"),
                  ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1", bias=True),
                  ConvProblem.parse("mb3ic8ih12oc8oh12kh3ph1")):
        assert store.get(other) is None


def test_problem_keys_parse_back():
    for p in (P, ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1", direction="bwd_filter", dtype="float64", bias=True),
              GemmProblem(3, 4, 5, trans_b=True, bias=True, activation="gelu")):
        assert cache.parse_problem_key(cache.problem_key(p)) == p
    with pytest.raises(ValueError):
        cache.parse_problem_key("what is this")


def test_another_version_or_device_is_not_used(store):
    store.put(_result(), version="0.0.1")
    store.put(_result(), device="cpu|Some Other CPU|avx2|64t")
    assert store.get(P) is None
    assert len(store.rows()) == 2 and store.rows(current_only=True) == []
    store.put(_result())
    assert store.get(P) is not None and len(store.rows(current_only=True)) == 1


def test_the_device_fingerprint_names_cpu_isa_and_threads():
    import dnnkit

    fp = cache.device_fingerprint()
    assert dnnkit._cpu.cpu_model_name() in fp and dnnkit._cpu.active_isa() in fp
    assert f"|{dnnkit.get_num_threads()}t" in fp


def _set_aside_files(directory):
    return [f for f in os.listdir(directory) if ".bad-" in f]


@pytest.mark.parametrize("content", [b"this is not a database at all" * 10, b"SQLite format 3\x00" + b"\xff" * 200],
                         ids=["text", "bad-header"])
def test_a_garbage_store_is_set_aside_with_a_warning(store, content):
    with open(store.path, "wb") as f:
        f.write(content)
    with pytest.warns(RuntimeWarning, match="unusable"):
        store.put(_result())
    assert store.get(P).best.algorithm == "direct"
    assert len(_set_aside_files(os.path.dirname(store.path))) == 1


def test_a_truncated_store_is_set_aside(store):
    for i in range(200):
        store.put(_result(p=ConvProblem.parse(f"mb{i + 1}ic8ih12oc8oh12kh3ph1")))
    store.close()
    size = os.path.getsize(store.path)
    with open(store.path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.warns(RuntimeWarning, match="unusable"):
        got = store.get(P)
    assert got is None  # the records went with the damaged file: a miss, never a wrong answer
    store.put(_result())
    assert store.get(P) is not None


def test_a_store_of_another_schema_is_set_aside(store):
    os.makedirs(os.path.dirname(store.path), exist_ok=True)
    conn = sqlite3.connect(store.path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('schema', '999')")
    conn.commit()
    conn.close()
    with pytest.warns(RuntimeWarning, match="schema 999"):
        store.put(_result())
    assert store.get(P) is not None


def test_an_unwritable_directory_falls_back_to_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(blocker / "sub"))
    s = cache.default_store()
    with pytest.warns(RuntimeWarning, match="in memory"):
        s.put(_result())
    assert s.get(P).best.algorithm == "direct"


def test_clear_and_import(store):
    store.put(_result())
    rows = store.rows()
    assert store.clear() == 1 and store.get(P) is None
    assert store.import_rows(rows) == 1 and store.get(P).best.algorithm == "direct"
    assert store.import_rows(rows) == 0  # not newer: kept as is
    with pytest.raises(ValueError, match="entry 0"):
        store.import_rows([{"problem": "nonsense"}])


_WORKER = textwrap.dedent("""
    import sys
    from dnnkit.autotune import find
    from dnnkit.problem import GemmProblem
    wid = int(sys.argv[1])
    for j in range(6):
        find(GemmProblem(8 + wid, 16 + j, 8), budget=0.001)
    print("done")
""")


def test_several_processes_tuning_into_one_store(tmp_path):
    env = dict(os.environ, DNNKIT_CACHE_DIR=str(tmp_path), DNNKIT_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(w)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "done" in out, err
        assert "Warning" not in err, err
    conn = sqlite3.connect(tmp_path / cache.FILENAME)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    keys = {r[0] for r in conn.execute("SELECT problem FROM results")}
    conn.close()
    want = {cache.problem_key(GemmProblem(8 + w, 16 + j, 8)) for w in range(4) for j in range(6)}
    assert keys == want
