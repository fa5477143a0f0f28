"""The persistent tuning cache: keys, devices and versions, clear and import, records checked on the way in
(the faults it survives are in test_faults.py)."""
from __future__ import annotations

import os
import sqlite3
import sys
import warnings

import pytest

from dnnkit import _config
from dnnkit.autotune import cache
from dnnkit.autotune.records import TuneRecord, TuneResult
from dnnkit.problem import ConvProblem, GemmProblem
from helpers import CACHED_PROBLEM, cached_result

P = CACHED_PROBLEM
_result = cached_result


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


def test_clear_and_import(store):
    store.put(_result())
    rows = store.rows()
    assert store.clear() == 1 and store.get(P) is None
    assert store.import_rows(rows) == 1 and store.get(P).best.algorithm == "direct"
    assert store.import_rows(rows) == 0  # not newer: kept as is
    with pytest.raises(ValueError, match="entry 0"):
        store.import_rows([{"problem": "nonsense"}])


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
    _config.changed()  # written behind its back: the remembered decisions are stale
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
