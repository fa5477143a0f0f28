"""Fault injection on the tuning cache: garbage, truncated and foreign stores, an unwritable directory, a lock
held past the timeout, a read-only file and directory (as a non-root user), a writer killed in the middle
of its transaction, and eight tuners on overlapping problems at once. Nothing committed is lost, no case
prints a traceback, and only a store that is not SQLite or fails its check is set aside."""
from __future__ import annotations

import os
import signal
import stat
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from dnnkit.autotune import cache
from dnnkit.problem import ConvProblem, GemmProblem
from helpers import CACHED_PROBLEM as P, cached_result as _result


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



_KILLED_WRITER = textwrap.dedent("""
    import sys
    from dnnkit.autotune import cache
    from dnnkit.autotune.records import TuneRecord, TuneResult
    from dnnkit.problem import GemmProblem
    s = cache.Store(sys.argv[1])
    for i in range(100000):
        s.put(TuneResult(GemmProblem(1 + i, 7, 5), [TuneRecord("blocked_gemm", "ok", median_s=1e-3)], 0.1))
        print(i, flush=True)  # after the commit
""")


def test_a_writer_killed_in_the_middle_loses_nothing_committed(tmp_path):
    """A writer killed (SIGKILL) while it commits record after record: every record it reported committed
    is there, the store passes its check, and the next writer carries on without setting anything aside."""
    path = str(tmp_path / cache.FILENAME)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, path], stdout=subprocess.PIPE, text=True)
    committed = -1
    deadline = time.monotonic() + 60
    while committed < 50 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        committed = int(line)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert committed >= 50, "the writer did not get going"
    s = cache.Store(path)
    for i in range(committed + 1):
        assert s.get(GemmProblem(1 + i, 7, 5)) is not None, i
    s.put(_result())
    s.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    assert not _set_aside_files(str(tmp_path))


_OVERLAPPING = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("error")
    from dnnkit.autotune import find
    from dnnkit.problem import GemmProblem
    wid = int(sys.argv[1])
    for j in range(6):
        find(GemmProblem(8, 16 + (wid + j) % 6, 8), budget=0.001)  # every worker tunes all six
    print("done")
""")


def test_eight_tuners_on_overlapping_problems(tmp_path):
    """Eight processes tuning the same six problems into one store at once: no warning, no traceback, one
    record per problem, and a store that passes its check."""
    env = dict(os.environ, DNNKIT_CACHE_DIR=str(tmp_path), DNNKIT_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _OVERLAPPING, str(w)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(8)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "done" in out and "Traceback" not in err, err
    conn = sqlite3.connect(tmp_path / cache.FILENAME)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    keys = [r[0] for r in conn.execute("SELECT problem FROM results")]
    conn.close()
    assert sorted(keys) == sorted(cache.problem_key(GemmProblem(8, 16 + j, 8)) for j in range(6))


def test_a_child_forked_while_another_thread_holds_the_store_can_use_it(tmp_path, monkeypatch):
    """The store's lock and connection do not cross a fork: a child forked while another thread of the parent
    is inside the store (holding its lock) looks results up instead of waiting forever."""
    import threading

    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    store = cache.default_store()
    store.put(_result())
    inside, release = threading.Event(), threading.Event()

    def hold():
        with store._lock:
            inside.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    inside.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: a lookup within 20 s, or SIGALRM ends it
            signal.alarm(20)
            try:
                found = cache.default_store().get(P)
                os._exit(0 if found is not None and found.best.algorithm == "direct" else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


class _Refusing:
    """A store's connection on a disk that refuses its statements of one kind with SQLite's error."""

    def __init__(self, conn, message, kinds):
        self._conn, self._message, self._kinds = conn, message, kinds

    def execute(self, sql, *args):
        if sql.lstrip().upper().startswith(self._kinds):
            raise sqlite3.OperationalError(self._message)
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


@pytest.mark.parametrize("message", ["disk I/O error", "database or disk is full"])
def test_a_write_the_disk_refuses_is_skipped_and_the_store_kept(tmp_path, message):
    """A full disk or an I/O error on a write: a warning, that result not stored, and the store (every
    record in it) where it was; never set aside. Where strict (the command line), CacheError."""
    path = str(tmp_path / cache.FILENAME)
    _populated(path)
    s = cache.Store(path)
    rows = s.rows()
    real = s._conn
    s._conn = _Refusing(real, message, ("INSERT", "BEGIN", "DELETE"))
    with pytest.warns(RuntimeWarning, match="not stored"):
        s.put(_result(p=GemmProblem(3, 5, 7)))
    with pytest.warns(RuntimeWarning, match="not stored"):
        assert s.import_rows([dict(rows[0], tuned_at=rows[0]["tuned_at"] + 1)]) == 0
    with pytest.warns(RuntimeWarning, match="not stored"):
        s.put_ceilings(1e12, 1e10)
    s.strict = True
    with pytest.raises(cache.CacheError, match=message):
        s.put(_result(p=GemmProblem(3, 5, 7)))
    s.strict = False
    s._conn = real
    assert s.path == path and s.get(GemmProblem(3, 5, 7)) is None and s.get(P).best.algorithm == "direct"
    s.put(_result(p=GemmProblem(3, 5, 7)))  # the disk has room again
    s.close()
    assert _count(path) == 21 and not _set_aside_files(str(tmp_path))


def test_a_read_the_disk_refuses_leaves_the_file_and_goes_on_in_memory(tmp_path):
    path = str(tmp_path / cache.FILENAME)
    _populated(path)
    s = cache.Store(path)
    assert s.get(P) is not None
    s._conn = _Refusing(s._conn, "disk I/O error", ("SELECT",))
    s.strict = True
    with pytest.raises(cache.CacheError, match="cannot read"):
        s.get(P)
    s.strict = False
    s._conn = _Refusing(cache.Store._open(path), "disk I/O error", ("SELECT",))
    with pytest.warns(RuntimeWarning, match="in memory"):
        assert s.get(P) is None
    s.put(_result(p=GemmProblem(3, 5, 7)))
    assert s.path == ":memory:" and s.get(GemmProblem(3, 5, 7)) is not None
    assert _count(path) == 20 and not _set_aside_files(str(tmp_path))


def test_a_store_whose_tables_are_not_this_schemas_is_set_aside(store):
    """Tables that lack a column of this schema: not a usable store (set aside), unlike a disk error."""
    store.put(_result())
    store.close()
    conn = sqlite3.connect(store.path)
    conn.execute("ALTER TABLE results DROP COLUMN elapsed_s")
    conn.commit()
    conn.close()
    with pytest.warns(RuntimeWarning, match="unusable"):
        store.put(_result(p=GemmProblem(3, 5, 7)))
    assert store.get(GemmProblem(3, 5, 7)) is not None
    assert len(_set_aside_files(os.path.dirname(store.path))) == 1


_NOT_A_STORE = textwrap.dedent("""
    import resource, sys, warnings
    if sys.argv[1] == "file-size limit":
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    from dnnkit.autotune import cache, find
    from dnnkit.problem import GemmProblem
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        result = find(GemmProblem(3, 3, 3), budget=0.0)
        assert result.best is not None
        rows = cache.default_store().rows()
        assert [r["problem"] for r in rows] == ["gemm m3n3k3_f32"], rows
        assert cache.default_store().get(GemmProblem(3, 3, 3)) is not None
    messages = [str(x.message) for x in w]
    assert sum("in memory" in m for m in messages) == 1, messages
    assert not any("unusable" in m for m in messages), messages
    print("ok")
""")


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, /dev/zero and RLIMIT_FSIZE")
@pytest.mark.parametrize("what", ["fifo", "symlink to /dev/zero", "file-size limit", "existing store, file-size limit"])
def test_a_store_that_cannot_be_opened_or_read_is_left_and_used_from_memory(tmp_path, what):
    """A FIFO or a device where the store should be, or a file-size limit that keeps SQLite from creating
    the store or its shared-memory file: find() and rows() go on with the cache in memory, one warning,
    no traceback, and the file left as it was."""
    path = tmp_path / cache.FILENAME
    if what == "fifo":
        os.mkfifo(path)
    elif what == "symlink to /dev/zero":
        os.symlink("/dev/zero", path)
    elif what.startswith("existing"):
        _populated(str(path))
    env = dict(os.environ, DNNKIT_CACHE_DIR=str(tmp_path), DNNKIT_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _NOT_A_STORE, what.removeprefix("existing store, ")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    assert not _set_aside_files(str(tmp_path))
    if what == "fifo":
        assert stat.S_ISFIFO(os.lstat(path).st_mode)
    elif what == "symlink to /dev/zero":
        assert os.readlink(path) == "/dev/zero"
    elif what.startswith("existing"):
        assert _count(path) == 20


_FILE_SIZE_LIMIT = textwrap.dedent("""
    import os, resource, sys, warnings
    from dnnkit.autotune import cache
    path = sys.argv[1]
    s = cache.Store(path)
    rows = s.rows()
    big = [dict(rows[0], problem=f"gemm m{1000 + i}n7k5_f32", records=rows[0]["records"] * 40) for i in range(200)]
    limit = max(os.path.getsize(path + x) for x in ("", "-wal", "-shm") if os.path.exists(path + x)) + 32768
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert s.import_rows(big) == 0
    messages = [str(x.message) for x in w]
    assert messages and all("not stored" in m for m in messages), messages
    s.strict = True
    try:
        s.import_rows(big)
        raise AssertionError("no CacheError")
    except cache.CacheError as e:
        assert "nothing was stored" in str(e), e
    assert len(s.rows()) == 20
    print("ok")
""")


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE")
def test_an_import_over_the_file_size_limit_keeps_the_store(tmp_path):
    """An import that outgrows the file-size limit (ulimit -f): a warning, nothing of it stored, and the
    store with every record it had, never set aside."""
    path = str(tmp_path / cache.FILENAME)
    _populated(path)
    r = subprocess.run([sys.executable, "-c", _FILE_SIZE_LIMIT, path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    assert _count(path) == 20 and not _set_aside_files(str(tmp_path))


_FIRST_USE = textwrap.dedent("""
    import os, sqlite3, sys, time, warnings
    warnings.simplefilter("error")
    from dnnkit.autotune import cache
    from dnnkit.autotune.records import TuneRecord, TuneResult
    from dnnkit.problem import GemmProblem
    role, flag = sys.argv[1], sys.argv[2]
    path = str(cache.cache_path())
    if role == "first":
        # The lock a process holds while it switches the fresh store to WAL, held long enough for the
        # second process to meet it there (their timing in a real race).
        os.makedirs(os.path.dirname(path), exist_ok=True)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        open(flag, "w").close()
        time.sleep(0.5)
        holder.execute("ROLLBACK")
        holder.close()
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.002)
    store = cache.default_store()
    base = 1 if role == "first" else 101
    for i in range(base, base + 3):
        store.put(TuneResult(GemmProblem(i, 7, 5), [TuneRecord("blocked_gemm", "ok", median_s=1e-3)], 0.1))
    print("done")
""")


def test_two_processes_opening_a_fresh_store_at_once_keep_every_record(tmp_path):
    """Two processes' first use of a fresh store: the second's switch to WAL meets the first's lock and
    SQLite answers busy at once; it waits (as for any other lock) and stores every record, no warning."""
    env = dict(os.environ, DNNKIT_CACHE_DIR=str(tmp_path / "cache"), DNNKIT_NUM_THREADS="1")
    flag = str(tmp_path / "holding")
    procs = [subprocess.Popen([sys.executable, "-c", _FIRST_USE, role, flag], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for role in ("first", "second")]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "done" in out, err
    conn = sqlite3.connect(tmp_path / "cache" / cache.FILENAME)
    keys = {r[0] for r in conn.execute("SELECT problem FROM results")}
    conn.close()
    assert keys == {cache.problem_key(GemmProblem(i, 7, 5)) for i in (1, 2, 3, 101, 102, 103)}
