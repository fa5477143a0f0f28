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
from helpers import CACHED_PROBLEM, cached_result, run_each_operator

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


def _every_kind_of_problem():
    """A problem of every kind the tuner stores: GEMM (transposes, packed weight, bias, each activation,
    float64, GPU), convolution (every direction, dtype, bias, GPU) and RNN (every cell and direction,
    bidirectional, without biases, with a projection, float64, GPU)."""
    from dnnkit.problem import RnnProblem

    out = [GemmProblem(3, 4, 5), GemmProblem(3, 4, 5, trans_a=True, dtype="float64"),
           GemmProblem(3, 4, 5, trans_b=True, packed=True, bias=True, activation="relu"),
           GemmProblem(3, 4, 5, device="cuda", trans_b=True)]
    out += [GemmProblem(6, 7, 8, trans_b=True, bias=True, activation=a) for a in ("tanh", "sigmoid", "gelu")]
    for direction in ("fwd", "bwd_data", "bwd_filter"):
        out += [ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1", direction=direction),
                ConvProblem.parse("g2mb1ic4ih9oc4oh4kh3sh2ph0", direction=direction, dtype="float64", bias=True),
                ConvProblem.parse("mb1ic4ih9oc4oh9kh3ph1", direction=direction, device="cuda")]
    for mode in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        for direction in ("fwd", "bwd"):
            out += [RnnProblem(mode, 2, 1, 4, 4, direction=direction),
                    RnnProblem(mode, 3, 2, 4, 8, layers=2, dirs=2, bias=False, direction=direction, dtype="float64"),
                    RnnProblem(mode, 2, 1, 4, 4, direction=direction, device="cuda")]
    out.append(RnnProblem("lstm", 2, 1, 4, 8, proj=3, direction="bwd"))
    return out


def test_every_kind_of_problem_key_parses_back():
    for p in _every_kind_of_problem():
        assert cache.parse_problem_key(cache.problem_key(p)) == p, cache.problem_key(p)
    for bad in ("lstm_fwd lstm_l1t2mb1slc4sic4_f32 float64 bias cpu",   # two dtypes
                "lstm_fwd lstm_l1t2mb1slc4sic4_nobias_f32 float32 bias cpu",  # biases and none
                "lstm_bwd lstm_l1t2mb1slc4sic4_f32 float32 bias cuda",  # two devices
                "gru_fwd lstm_l1t2mb1slc4sic4_f32 float32 bias cpu",  # two cells
                "lstm_sideways lstm_l1t2mb1slc4sic4_f32 float32 bias cpu", "conv2d_up mb1ic1ih5oc1kh3 float32 cpu",
                "gemm", "lstm_fwd lstm_l1t2mb1slc4sic4_f32 float32 nobias cpu", 7):
        with pytest.raises(ValueError, match="not a problem key"):
            cache.parse_problem_key(bad)


def test_export_and_import_restore_every_kind_of_record(store):
    """What `dnnkit cache export` writes (rows()), imported into an empty store, gives back every result:
    GEMM, convolution and RNN records alike."""
    problems = _every_kind_of_problem()
    for i, p in enumerate(problems):
        store.put(_result(p=p, best=f"algo{i}"))
    rows = store.rows()
    assert len(rows) == len(problems)
    assert store.clear() == len(problems)
    assert store.import_rows(rows) == len(problems)
    for i, p in enumerate(problems):
        got = store.get(p, device=cache.device_fingerprint(p.device))
        assert got is not None and got.best.algorithm == f"algo{i}", cache.problem_key(p)


def test_an_unresolvable_cache_directory_warns_once_and_the_operators_work(monkeypatch):
    """DNNKIT_CACHE_DIR naming a home directory that does not exist: one warning, the cache in memory, and
    gemm, conv2d, lstm and the cost model carry on."""
    import uuid

    from dnnkit.autotune import cost_model

    monkeypatch.setenv("DNNKIT_CACHE_DIR", f"~dnnkit-no-such-user-{uuid.uuid4().hex}/x")
    _config.changed()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            run_each_operator()
            assert cost_model.ceilings()["source"].startswith("nominal")
            _config.changed()
    messages = [str(w.message) for w in caught]
    assert sum("cannot resolve" in m for m in messages) == 1, messages
    assert cache.default_store().path == ":memory:"
    with pytest.raises(cache.CacheError, match="DNNKIT_CACHE_DIR"):  # (what the command line reports)
        cache.cache_path()
