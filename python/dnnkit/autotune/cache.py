"""The persistent tuning cache: one SQLite store per user.

Where: $DNNKIT_CACHE_DIR/tuning.sqlite3 if that is set, else the platform's user cache directory
($XDG_CACHE_HOME or ~/.cache on Linux, ~/Library/Caches on macOS, %LOCALAPPDATA% on Windows) /dnnkit.

What a record is keyed by, and so what invalidates it:
  - the problem: operator, descriptor (shapes, strides, padding, ...), dtype, bias, activation, device;
    a layer's name is not part of it (two layers of one shape share a record);
  - the device fingerprint: CPU model, active ISA and thread count (a GPU's name, compute capability and
    driver for CUDA problems); a record tuned on another machine, ISA or thread count is never used;
  - the dnnkit version: an upgrade re-tunes (kernels change between versions);
  - the schema version of the store: a store written with another schema is set aside as a whole.
Records are never deleted by dnnkit except through `dnnkit cache clear`.

Safety: several processes may tune into one store at once. The store is in SQLite's WAL mode, so that
readers never wait for a writer; each write is one short transaction, and a writer waits up to 30 s for
another, then skips its write with a warning. Opening waits as long: a setup statement that SQLite answers
"busy" at once (the switch to WAL while another process creates the store) is tried again with backoff.
A store that is busy for longer is busy, not damaged: nothing is moved and nothing is lost. Only a file
that is not an SQLite database, is corrupt (fails its integrity check, or a read finds it malformed), or
carries another schema or tables not of this schema is renamed aside (kept for inspection) with a
warning, and a new one is started: never a crash, never a wrong answer. Any other failure is the
machine's, not the store's, and never moves it:
  - a write refused by the disk (full, an I/O error, the file-size limit): a warning, and that result is
    not stored; the store stays as it was;
  - a store that cannot be read or opened (an I/O error, a FIFO or device where the file should be, a
    directory that cannot be created, a cache directory that cannot be resolved): a warning, and the
    cache lives in memory for the process;
  - a store that cannot be written (a read-only file, or a read-only directory: a shared, pre-tuned
    store) is read and used; writes are skipped with one warning.
With Store.strict set (the command line sets it), the failures of the first two kinds raise CacheError
instead of warning (nothing moves to memory), and cache_path() raises CacheError where the directory cannot
be resolved (default_store() then warns once and keeps the cache in memory).
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
import threading
import time
import warnings
from pathlib import Path

from .._config import changed  # every write makes dispatch's remembered decisions stale
from ..backends import BACKENDS

SCHEMA_VERSION = 1
FILENAME = "tuning.sqlite3"


class CacheError(RuntimeError):
    """The tuning cache cannot be used: its directory cannot be resolved, or (Store.strict) its file cannot be
    opened, read or written."""


def cache_dir() -> Path:
    """The cache directory; CacheError naming the variable where it cannot be resolved (a home directory
    that does not exist, as in DNNKIT_CACHE_DIR='~nosuchuser/x')."""
    env = os.environ.get("DNNKIT_CACHE_DIR")
    try:
        if env:
            return Path(env).expanduser()
        if sys.platform == "win32":
            base = os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local"
            return Path(base) / "dnnkit" / "Cache"
        if sys.platform == "darwin":
            return Path.home() / "Library" / "Caches" / "dnnkit"
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dnnkit"
    except (RuntimeError, KeyError, OSError, ValueError) as e:
        what = f"DNNKIT_CACHE_DIR={env!r}" if env else "the home directory"
        raise CacheError(f"tuning cache: cannot resolve {what} ({e})") from None


def cache_path() -> Path:
    return cache_dir() / FILENAME


def device_fingerprint(device: str = "cpu") -> str:
    """What a tuning result is valid for, besides the problem and the version: the backend's fingerprint."""
    return BACKENDS["cuda" if device == "cuda" else "cpu"].fingerprint()


def _version() -> str:
    from .._version import __version__

    return __version__


def problem_key(p) -> str:
    """The problem part of a record's key: everything that defines the computation, not the name."""
    if p.op == "gemm":
        return f"gemm {p.descriptor()}"
    import dataclasses

    q = dataclasses.replace(p, name="") if getattr(p, "name", "") else p
    return f"{p.op} {q.descriptor()} {p.dtype}{' bias' if getattr(p, 'bias', False) else ''} {p.device}"


def parse_problem_key(key: str):
    """The Problem a problem_key() came from (GEMM, convolution or RNN); ValueError where key is not one
    problem_key() gives."""
    from ..problem import CONV_DIRECTIONS, RNN_DIRECTIONS, RNN_MODES, ConvProblem, GemmProblem, RnnProblem

    if not isinstance(key, str):
        raise ValueError(f"not a problem key: {key!r}")
    parts = key.split(" ")
    op = parts[0]
    p = None
    if op == "gemm" and len(parts) == 2:
        p = GemmProblem.parse(parts[1])
    elif len(parts) in (4, 5) and (len(parts) == 4 or parts[3] == "bias"):
        bias = len(parts) == 5
        if op.startswith("conv2d_") and op[len("conv2d_"):] in CONV_DIRECTIONS:
            p = ConvProblem.parse(parts[1], direction=op[len("conv2d_"):], dtype=parts[2], bias=bias,
                                  device=parts[-1])
        elif op.rpartition("_")[0] in RNN_MODES and op.rpartition("_")[2] in RNN_DIRECTIONS:
            p = RnnProblem.parse(parts[1], direction=op.rpartition("_")[2])
    # Every field the key holds twice (an RNN's dtype, bias and device; the operator) must agree.
    if p is None or problem_key(p) != key:
        raise ValueError(f"not a problem key: {key!r}")
    return p


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS results ("
    " problem TEXT NOT NULL, device TEXT NOT NULL, version TEXT NOT NULL,"
    " op TEXT NOT NULL, best TEXT, best_s REAL, records TEXT NOT NULL,"
    " tuned_at REAL NOT NULL, elapsed_s REAL NOT NULL,"
    " PRIMARY KEY (problem, device, version))",
    "CREATE TABLE IF NOT EXISTS ceilings ("
    " device TEXT PRIMARY KEY, peak_flops REAL NOT NULL, copy_bytes_per_s REAL NOT NULL, measured_at REAL NOT NULL)",
)


class _Foreign(Exception):
    pass


class _Busy(Exception):
    """Another connection holds the store's lock for longer than the busy timeout."""


class _Damaged(sqlite3.DatabaseError):
    """The store fails its integrity check."""


def _is_busy(e: Exception) -> bool:
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


def _is_read_only(e: Exception) -> bool:
    """A write refused by the file system (file or directory modes, a read-only mount)."""
    msg = str(e).lower()
    return "readonly" in msg or "read-only" in msg or "unable to open database file" in msg


# SQLite's word for a file that is not a usable store: not a database, corrupt, or of other tables (a
# statement of this schema's that names a table or column the file lacks). Every other error (I/O, a
# full disk, the file-size limit, memory) is the machine's and leaves the file where it is.
_DAMAGE_NAMES = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
_DAMAGE_WORDS = ("file is not a database", "malformed", "no such table", "no such column", "has no column",
                 "columns but")


def _is_damaged(e: Exception) -> bool:
    if isinstance(e, (_Foreign, _Damaged, sqlite3.IntegrityError)):
        return True
    if not isinstance(e, sqlite3.DatabaseError):
        return False
    if str(getattr(e, "sqlite_errorname", "") or "").startswith(_DAMAGE_NAMES):
        return True
    msg = str(e).lower()
    return any(w in msg for w in _DAMAGE_WORDS)


def _writable(path: str) -> bool:
    """Whether this process may write the store and create its journal files beside it."""
    d = os.path.dirname(path) or "."
    return os.access(d, os.W_OK | os.X_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))


class Store:
    """One tuning store (an SQLite file, or ":memory:")."""

    def __init__(self, path, timeout_s: float = 30.0):
        self.path = str(path)
        self.timeout_s = float(timeout_s)  # how long a writer waits for another's lock
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._memory_fallback = False
        self.read_only = False  # writes are skipped (the file or its directory cannot be written)
        self._warned_read_only = False
        self._warned_ceilings: set = set()
        # True: a store that cannot be opened, read or written raises CacheError (no memory fallback).
        self.strict = False

    # ------------------------------------------------------------------------------------------ opening
    def _connect(self, create: bool) -> sqlite3.Connection | None:
        """The open connection; None when the file does not exist and create is False, or the store is
        busy or cannot be opened by this process (a warning says which)."""
        if self._conn is not None:
            return self._conn
        if self.path != ":memory:":
            if not os.path.exists(self.path):
                if not create:
                    return None
                try:
                    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                    if not _writable(self.path):
                        raise PermissionError("no write permission")
                except OSError as e:
                    self._unusable(f"cannot create {self.path} ({e})")
            elif not os.path.isfile(self.path):
                # A FIFO, a device or a directory: not a store, and not dnnkit's to move.
                self._unusable(f"{self.path} is not a regular file")
        set_aside = False
        while True:
            if self.path == ":memory:":
                self.read_only = False
                self._conn = self._open(self.path, self.timeout_s, False)
                return self._conn
            try:
                self.read_only = not _writable(self.path)
                self._conn = self._open_waiting(self.path, self.read_only)
                return self._conn
            except _Busy as e:
                warnings.warn(f"dnnkit: tuning cache {self.path} is busy ({e}); skipped", RuntimeWarning,
                              stacklevel=4)
                return None
            except (sqlite3.DatabaseError, _Foreign) as e:
                if _is_damaged(e):
                    if set_aside:
                        self._unusable(f"{self.path} still unusable after a fresh start ({e})")
                    else:
                        self._set_aside(e)
                        set_aside = True
                elif _is_read_only(e):
                    # A store this process cannot open at all: a miss, and the file stays where it is.
                    warnings.warn(f"dnnkit: tuning cache {self.path} cannot be opened ({e}); not used",
                                  RuntimeWarning, stacklevel=4)
                    return None
                else:
                    self._unusable(f"cannot open {self.path} ({e})")
            except OSError as e:
                self._unusable(f"cannot open {self.path} ({e})")

    def _open_waiting(self, path: str, read_only: bool) -> sqlite3.Connection:
        """_open, tried again with backoff while it finds the store busy, for up to timeout_s: a setup
        statement may answer busy at once, without SQLite's busy timeout (the switch to WAL while another
        connection holds a lock on a store it is creating)."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.001
        while True:
            try:
                return self._open(path, self.timeout_s, read_only)
            except _Busy:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(2 * delay, 0.05)

    @staticmethod
    def _open(path: str, timeout_s: float = 30.0, read_only: bool = False) -> sqlite3.Connection:
        """A connection to a valid store of this schema. Raises _Busy where another connection's lock
        outlasts the timeout, _Foreign for another schema, sqlite3.DatabaseError for a damaged file (and
        for failures of the machine's: _is_damaged tells them apart)."""
        if read_only:
            # mode=ro: SQLite never writes; a store in WAL mode whose directory cannot hold its -shm
            # file opens as immutable (nothing else can be changing it there either).
            from urllib.parse import quote

            uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
            try:
                conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None,
                                       check_same_thread=False)
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError as e:
                if _is_busy(e):
                    raise _Busy(str(e)) from None
                conn = sqlite3.connect(uri + "&immutable=1", uri=True, timeout=timeout_s, isolation_level=None,
                                       check_same_thread=False)
        else:
            conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            try:
                ok = conn.execute("PRAGMA quick_check").fetchone()
                if ok is None or ok[0] != "ok":
                    raise _Damaged(f"integrity check failed: {ok}")
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if tables:
                    row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() \
                        if "meta" in tables else None
                    if row is None or row[0] != str(SCHEMA_VERSION):
                        raise _Foreign(f"schema {row[0] if row else 'unknown'}, this dnnkit writes {SCHEMA_VERSION}")
                if read_only:
                    if not {"meta", "results", "ceilings"} <= tables:
                        raise sqlite3.OperationalError("unable to open database file: a read-only store "
                                                       "without dnnkit's tables")
                    return conn
                # WAL: readers go on while another connection writes (a no-op once the store is in it).
                conn.execute("PRAGMA journal_mode = WAL")
                if {"meta", "results", "ceilings"} <= tables:
                    return conn
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for stmt in _SCHEMA:
                        conn.execute(stmt)
                    conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:  # (SQLite has rolled back already after some errors)
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as e:
                if _is_busy(e):
                    raise _Busy(str(e)) from None
                raise
            return conn
        except BaseException:
            conn.close()
            raise

    def _set_aside(self, why) -> None:
        """Rename an unusable store (and its journal) aside, so a new one starts; keep it for inspection."""
        self._drop_connection()
        aside = f"{self.path}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        try:
            os.replace(self.path, aside)
            for suffix in ("-journal", "-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.replace(self.path + suffix, aside + suffix)
            where = f"moved it to {aside}"
        except FileNotFoundError:
            where = "another process already moved it aside"
        except OSError as e:
            where = f"could not move it aside ({e})"
        warnings.warn(f"dnnkit: the tuning cache {self.path} is unusable ({why}); {where} and started a new one",
                      RuntimeWarning, stacklevel=4)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def _unusable(self, why) -> None:
        """The file cannot serve as the store (and is left as it is): CacheError where strict, else a
        warning and a store in memory for the rest of the process."""
        self._drop_connection()
        if self.strict:
            raise CacheError(f"tuning cache: {why}")
        self._fall_back_to_memory(why)

    def _fall_back_to_memory(self, why) -> None:
        warnings.warn(f"dnnkit: tuning cache: {why}; tuning results are kept in memory for this process only",
                      RuntimeWarning, stacklevel=5)
        self.path = ":memory:"
        self._memory_fallback = True

    def _skip_write(self, why) -> None:
        if not self._warned_read_only:
            self._warned_read_only = True
            warnings.warn(f"dnnkit: tuning cache {self.path} is read-only ({why}); it is read and used, and "
                          "new results are not stored", RuntimeWarning, stacklevel=4)

    def _write_failed(self, e) -> None:
        """A write the machine refused (a full disk, an I/O error, the file-size limit): nothing of it is
        stored, and the store stays as it was."""
        if self.strict:
            raise CacheError(f"cannot write the tuning cache {self.path} ({e}); nothing was stored")
        warnings.warn(f"dnnkit: tuning cache {self.path}: a write failed ({e}); that result is not stored, and the "
                      "store is kept as it was", RuntimeWarning, stacklevel=4)

    def _run(self, create: bool, fn, default=None, write: bool = False):
        """fn(conn) under the lock; a store found damaged mid-way is set aside and fn retried once.
        A store locked by another connection for longer than the busy timeout: a warning and default;
        a write to a store that cannot be written: one warning for the store, and default; a write the
        machine refuses: a warning and default; a read that fails: the store in memory (_unusable)."""
        with self._lock:
            for attempt in (1, 2):
                conn = self._connect(create)
                if conn is None:
                    return default
                if write and self.read_only:
                    self._skip_write("no write permission")
                    return default
                try:
                    return fn(conn)
                except sqlite3.DatabaseError as e:
                    if conn.in_transaction:
                        try:
                            conn.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass
                    if _is_busy(e):
                        warnings.warn(f"dnnkit: tuning cache {self.path} is busy ({e}); skipped", RuntimeWarning,
                                      stacklevel=3)
                        return default
                    if _is_damaged(e) and attempt == 1 and self.path != ":memory:":
                        self._set_aside(e)
                        continue
                    if _is_read_only(e):
                        self.read_only = True
                        self._skip_write(e)
                        return default
                    if write:
                        self._write_failed(e)
                    else:
                        self._unusable(f"cannot read {self.path} ({e})")
                    return default
            return default

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------------------------------------ records
    def put(self, result, device: str | None = None, version: str | None = None) -> None:
        """Store a TuneResult (replacing the record of the same problem, device and version)."""
        p = result.problem
        best = result.best
        row = (problem_key(p), device or device_fingerprint(p.device), version or _version(), p.op,
               best.algorithm if best else None, best.median_s if best else None,
               json.dumps([r.to_dict() for r in result]), time.time(), float(result.elapsed_s))

        def write(conn):
            conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

        self._run(True, write, write=True)
        changed()

    def get(self, p, device: str | None = None, version: str | None = None):
        """The TuneResult stored for p on this device and version, or None."""
        from .records import TuneRecord, TuneResult

        key = (problem_key(p), device or device_fingerprint(p.device), version or _version())
        row = self._run(False, lambda c: c.execute(
            "SELECT records, elapsed_s FROM results WHERE problem = ? AND device = ? AND version = ?", key).fetchone())
        if row is None:
            return None
        try:
            records = [TuneRecord.from_dict(d) for d in json.loads(row[0])]
        except (ValueError, TypeError):
            return None  # a record this dnnkit cannot read is a miss, not a wrong answer
        return TuneResult(p, records, row[1], source="cache")

    def rows(self, *, current_only: bool = False) -> list[dict]:
        """Every stored result as a dict (problem, device, version, op, best, best_s, tuned_at, records)."""
        def read(conn):
            return conn.execute("SELECT problem, device, version, op, best, best_s, tuned_at, elapsed_s, records "
                                "FROM results ORDER BY op, problem, device, version").fetchall()

        out = []
        for r in self._run(False, read, default=[]):
            d = dict(zip(("problem", "device", "version", "op", "best", "best_s", "tuned_at", "elapsed_s"), r[:8]))
            try:
                d["records"] = json.loads(r[8])
            except ValueError:
                d["records"] = []
            out.append(d)
        if current_only:
            out = [d for d in out if d["version"] == _version() and d["device"] == device_fingerprint(
                "cuda" if d["problem"].endswith(" cuda") or d["problem"].endswith("_cuda") else "cpu")]
        return out

    def device_rows(self, device: str, version: str, after: int = 0) -> tuple[list[tuple], int, int]:
        """For a refit: ([(rowid, problem, records JSON)] of device and version stored after rowid `after`,
        how many rows that device and version has in all, the highest rowid of the store). A row replaced
        by a newer result of its problem gets a new rowid."""
        def read(conn):
            new = conn.execute("SELECT rowid, problem, records FROM results WHERE device = ? AND version = ? "
                               "AND rowid > ? ORDER BY rowid", (device, version, after)).fetchall()
            count = conn.execute("SELECT COUNT(*) FROM results WHERE device = ? AND version = ?",
                                 (device, version)).fetchone()[0]
            top = conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM results").fetchone()[0]
            return new, count, top

        return self._run(False, read, default=([], 0, 0))

    def clear(self, pattern: str | None = None, device: str | None = None) -> int:
        """Delete results; returns how many. With neither argument every result and ceiling; else the
        results whose problem key contains `pattern` (all, where None), of `device` only (any, where None)."""
        def wipe(conn):
            conn.execute("BEGIN IMMEDIATE")
            if pattern is None and device is None:
                n = conn.execute("DELETE FROM results").rowcount
                conn.execute("DELETE FROM ceilings")
            else:
                n = conn.execute("DELETE FROM results WHERE instr(problem, ?) > 0 AND (? IS NULL OR device = ?)",
                                 (pattern or "", device, device)).rowcount
            conn.execute("COMMIT")
            return n

        n = self._run(False, wipe, default=0, write=True)
        changed()
        return n

    def import_rows(self, rows: list[dict]) -> int:
        """Merge exported rows (export() format): each is validated; a newer tuned_at wins."""
        from .records import TuneRecord

        clean = []
        for i, d in enumerate(rows):
            try:
                parse_problem_key(d["problem"])
                records = [TuneRecord.from_dict(r) for r in d["records"]]
                best = next((r for r in records if r.ok), None)
                clean.append((d["problem"], str(d["device"]), str(d["version"]), str(d["op"]),
                              best.algorithm if best else None, best.median_s if best else None,
                              json.dumps([r.to_dict() for r in records]), float(d["tuned_at"]),
                              float(d.get("elapsed_s") or 0.0)))
            except (KeyError, TypeError, ValueError) as e:
                name = d.get("problem") if isinstance(d, dict) else None
                raise ValueError(f"cache import: entry {i}{f' ({name})' if name else ''} is not a tuning result "
                                 f"({e}); nothing imported") from None

        def write(conn):
            conn.execute("BEGIN IMMEDIATE")
            n = 0
            for row in clean:
                old = conn.execute("SELECT tuned_at FROM results WHERE problem = ? AND device = ? AND version = ?",
                                   row[:3]).fetchone()
                if old is None or old[0] < row[7]:
                    conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
                    n += 1
            conn.execute("COMMIT")
            return n

        n = self._run(True, write, default=0, write=True)
        changed()
        return n

    # ----------------------------------------------------------------------------------------- ceilings
    def put_ceilings(self, peak_flops: float, copy_bytes_per_s: float, device: str | None = None) -> None:
        for name, v in (("peak_flops", peak_flops), ("copy_bytes_per_s", copy_bytes_per_s)):
            if not _positive_finite(v):
                raise ValueError(f"put_ceilings: {name} must be a positive finite number, got {v!r}")
        row = (device or device_fingerprint(), float(peak_flops), float(copy_bytes_per_s), time.time())
        self._run(True, lambda c: c.execute("INSERT OR REPLACE INTO ceilings VALUES (?, ?, ?, ?)", row), write=True)
        changed()

    def get_ceilings(self, device: str | None = None) -> dict | None:
        """The ceilings stored for device (default: this CPU), or None where there are none. A row whose
        figures are not positive finite numbers (written behind dnnkit's back) counts as none, with one
        warning per store and row."""
        device = device or device_fingerprint()
        row = self._run(False, lambda c: c.execute(
            "SELECT peak_flops, copy_bytes_per_s FROM ceilings WHERE device = ?", (device,)).fetchone())
        if row is None:
            return None
        if all(_positive_finite(v) for v in row):
            return {"peak_flops": float(row[0]), "copy_bytes_per_s": float(row[1])}
        if (device, tuple(row)) not in self._warned_ceilings:
            self._warned_ceilings.add((device, tuple(row)))
            warnings.warn(f"dnnkit: tuning cache {self.path}: the ceilings stored for {device} are not positive "
                          f"finite numbers (peak_flops={row[0]!r}, copy_bytes_per_s={row[1]!r}); ignored, using "
                          "nominal values until they are measured again", RuntimeWarning, stacklevel=2)
        return None


def _positive_finite(v) -> bool:
    """Whether v is a number (not a bool) that can be a ceiling: positive and finite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


# Connections a forked child inherited: never used there (SQLite connections must not cross a fork), and
# never closed there either (closing could touch the parent's file state); kept so no finalizer runs.
_inherited_connections: list = []


def _after_fork_in_child() -> None:
    """A child forked while another thread of the parent held a store's lock would wait on it forever: the
    child starts with fresh locks, and opens its own connections."""
    global _stores_lock
    _stores_lock = threading.Lock()
    for store in _stores.values():
        store._lock = threading.RLock()
        if store._conn is not None:
            _inherited_connections.append(store._conn)
            store._conn = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def default_store() -> Store:
    """The store at cache_path() (DNNKIT_CACHE_DIR is read at each call). Where that cannot be resolved, a
    store in memory, with one warning per unresolvable setting (cache_path() raises CacheError)."""
    try:
        path = str(cache_path())
    except CacheError as e:
        with _stores_lock:
            key = f"<unresolved> {e}"
            s = _stores.get(key)
            if s is None:
                s = _stores[key] = Store(":memory:")
                s._memory_fallback = True
                warnings.warn(f"dnnkit: {e}; tuning results are kept in memory for this process only",
                              RuntimeWarning, stacklevel=2)
            return s
    with _stores_lock:
        s = _stores.get(path)
        if s is None:
            s = _stores[path] = Store(path)
        return s
