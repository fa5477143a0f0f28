"""The persistent tuning cache: keys, corrupt and foreign stores, several processes at once."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import warnings

import pytest

from dnnkit.autotune import cache
from dnnkit.autotune.records import TuneRecord, TuneResult
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


def _populated(path, n=20):
    s = cache.Store(path)
    for i in range(n):
        s.put(_result(p=ConvProblem.parse(f"mb{i + 1}ic8ih12oc8oh12kh3ph1")))
    s.close()


def _count(path):
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_store_locked_for_a_while_is_busy_not_damaged(tmp_path, journal):
    """Another connection holding the store's lock past the busy timeout: reads go on (WAL) or miss
    (a store still in rollback-journal mode), writes are skipped with a warning, and nothing is moved
    aside or lost."""
    path = str(tmp_path / cache.FILENAME)
    _populated(path)
    holder = sqlite3.connect(path, isolation_level=None)
    if journal == "delete":
        holder.execute("PRAGMA journal_mode = DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        s = cache.Store(path, timeout_s=0.2)
        if journal == "wal":
            assert s.get(P).best.algorithm == "direct"
        else:
            with pytest.warns(RuntimeWarning, match="busy"):
                assert s.get(P) is None
        with pytest.warns(RuntimeWarning, match="busy"):
            s.put(_result(p=GemmProblem(3, 5, 7)))
        assert not _set_aside_files(str(tmp_path))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert s.get(P).best.algorithm == "direct" and _count(path) == 20
    s.put(_result(p=GemmProblem(3, 5, 7)))
    s.close()
    assert _count(path) == 21 and not _set_aside_files(str(tmp_path))


_READ_ONLY = textwrap.dedent("""
    import subprocess, sys, warnings
    from dnnkit.autotune import cache
    from dnnkit.autotune.records import TuneRecord, TuneResult
    from dnnkit.problem import ConvProblem, GemmProblem
    path = sys.argv[1]
    P = ConvProblem.parse("mb1ic8ih12oc8oh12kh3ph1")
    s = cache.Store(path)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert s.get(P).best.algorithm == "direct"
        assert len(s.rows()) == 20
        for m in (3, 4):
            s.put(TuneResult(GemmProblem(m, 5, 7), [TuneRecord("blocked_gemm", "ok", median_s=1e-3)], 0.1))
        assert s.get(GemmProblem(3, 5, 7)) is None
        assert s.clear() == 0 and s.import_rows(s.rows()) == 0
        s.put_ceilings(1e11, 1e10)
        assert s.get(P).best.algorithm == "direct"
    messages = [str(x.message) for x in w]
    assert sum("read-only" in m for m in messages) == 1, messages
    assert not any("unusable" in m or "busy" in m for m in messages), messages
    for action in (["list"], ["clear", "--all"], ["clear", "mb1"]):
        r = subprocess.run([sys.executable, "-m", "dnnkit", "cache"] + action, capture_output=True, text=True)
        assert r.returncode == 0 and "Traceback" not in r.stderr and "unusable" not in r.stderr, r.stderr
    print("ok")
""")


def _without_file_permission_override():
    """A command prefix under which the file modes bind this process (root's DAC override dropped)."""
    if os.geteuid() != 0:
        return []
    import shutil

    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file modes do not bind root")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_read_only_store_is_read_and_never_moved(tmp_path, what):
    """A pre-tuned store that this process may not write (the file 444, or its directory 555): read and
    used; writes, clear and import skipped with one warning, never a traceback; the file stays."""
    prefix = _without_file_permission_override()
    d = tmp_path / "store"
    d.mkdir()
    path = str(d / cache.FILENAME)
    _populated(path)
    before = sorted(os.listdir(d))
    os.chmod(path if what == "file" else d, 0o444 if what == "file" else 0o555)
    try:
        env = dict(os.environ, DNNKIT_CACHE_DIR=str(d))
        r = subprocess.run(prefix + [sys.executable, "-c", _READ_ONLY, path], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    finally:
        os.chmod(d, 0o755)
        os.chmod(path, 0o644)
    # (SQLite may leave its -wal and -shm files beside a store read in WAL mode.)
    assert sorted(f for f in os.listdir(d) if not f.endswith(("-wal", "-shm"))) == before and _count(path) == 20


@pytest.mark.parametrize("field,value", [("workspace_bytes", "big"), ("median_s", -1.0), ("reps", 2.5),
                                         ("median_s", "fast"), ("algorithm", 7), ("reason", ["x"])])
def test_a_record_of_wrong_types_is_refused_on_import_and_skipped_in_the_store(store, field, value):
    import json

    import numpy as np

    import dnnkit

    store.put(_result())
    rows = store.rows()
    bad = json.loads(json.dumps(rows))
    bad[0]["records"][0][field] = value
    store.clear()
    with pytest.raises(ValueError, match=f"entry 1 .*{field}.*nothing imported"):
        store.import_rows(rows + bad)
    assert store.rows() == []  # all or nothing
    # The same record already in the store (written behind dnnkit's back): a miss, and calls go on.
    store.import_rows(rows)
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE results SET records = ?", (json.dumps(bad[0]["records"]),))
    conn.commit()
    conn.close()
    cache._generation[0] += 1
    assert store.get(P) is None
    x = np.ones((2, 8, 12, 12), np.float32)
    w = np.ones((8, 8, 3, 3), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither the call nor the cost model's calibration trips on it
        assert dnnkit.conv2d(x, w, padding=1).shape == (2, 8, 12, 12)


def test_a_record_of_an_unknown_algorithm_gives_way_to_the_next_measured(store):
    from dnnkit import dispatch

    store.put(TuneResult(P, [TuneRecord("renamed_since", "ok", median_s=1e-5, workspace_bytes=0),
                             TuneRecord("direct", "ok", median_s=1e-3, workspace_bytes=0),
                             TuneRecord("im2col_gemm", "ok", median_s=2e-3, workspace_bytes=0)], 0.5))
    assert dispatch.choose(P).name == "direct"


def test_clear_by_pattern_and_device(store):
    store.put(_result())
    store.put(_result(p=GemmProblem(3, 5, 7)))
    store.put(_result(p=GemmProblem(3, 5, 9)), device="cpu|another machine|avx2|2t")
    assert store.clear(pattern="gemm m3n5k9", device=cache.device_fingerprint()) == 0  # another device's
    assert store.clear(pattern="gemm m3n5") == 2 and len(store.rows()) == 1
    assert store.clear() == 1 and store.rows() == []
