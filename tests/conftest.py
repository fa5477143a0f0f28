"""Shared configuration: the hypothesis profile, and fixtures that run a test under every ISA this CPU
supports, under 1 and 2 threads, and for every registered CPU GEMM algorithm; and NaN-filled RNN outputs."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# The tests never read or write the user's tuning cache: one private cache directory for the session
# (the CLI tests' subprocesses inherit it).
_CACHE_DIR = tempfile.mkdtemp(prefix="dnnkit-test-cache-")
os.environ["DNNKIT_CACHE_DIR"] = _CACHE_DIR
atexit.register(shutil.rmtree, _CACHE_DIR, True)

import dnnkit  # noqa: E402
from helpers import amx_set  # noqa: E402

# "ci": reproducible (derandomized, no example database) and small enough for a 2-core machine.
# "dev": more and random examples, for hunting bugs locally (HYPOTHESIS_PROFILE=dev).
# The function-scoped fixtures below only set process-wide state (ISA, threads) that every example of a
# test shares, so reusing them across examples is intended.
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", deadline=None, max_examples=40, derandomize=True, database=None, suppress_health_check=_SUPPRESS,
    print_blob=True,
)
settings.register_profile("dev", deadline=None, max_examples=300, suppress_health_check=_SUPPRESS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Small shapes are what the tests can afford: let them reach the multi-threaded code, which products
# below a size (a few microseconds of work) otherwise skip.
dnnkit._cpu.set_min_parallel_work(0)

ISA_ORDER = ("ref", "avx2", "avx512")  # each ISA's CPUs run every ISA before it
SUPPORTED_ISAS = ISA_ORDER[: ISA_ORDER.index(dnnkit._cpu.detected_isa()) + 1]
THREAD_COUNTS = (1, 2)
GEMM_ALGORITHMS = dnnkit.algos.algorithms("gemm", "cpu")


@pytest.fixture(params=SUPPORTED_ISAS)
def isa(request):
    """Runs the test with dnnkit's CPU kernels switched to each supported ISA in turn."""
    previous = dnnkit._cpu.active_isa()
    dnnkit._cpu.set_isa(request.param)
    try:
        yield request.param
    finally:
        dnnkit._cpu.set_isa(previous)


@pytest.fixture
def no_amx():
    """The FMA kernels only (float32 products that would run on AMX tiles do not): for tests of bitwise
    agreement between two FMA drivers, where one of them would otherwise take the tiles."""
    yield from amx_set(False)


@pytest.fixture(params=THREAD_COUNTS, ids=lambda n: f"threads{n}")
def num_threads(request):
    previous = dnnkit.get_num_threads()
    dnnkit.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        dnnkit.set_num_threads(previous)


@pytest.fixture(params=GEMM_ALGORITHMS, ids=lambda a: a.name)
def gemm_algo(request):
    """Every registered CPU GEMM algorithm, so a new one is tested with no change here."""
    return request.param


@pytest.fixture(autouse=True)
def _restore_settings():
    """No test leaks process-wide settings into the next one."""
    isa, threads = dnnkit._cpu.active_isa(), dnnkit.get_num_threads()
    tuning, limit = dnnkit.get_tuning(), dnnkit.get_workspace_limit()
    yield
    dnnkit._cpu.set_isa(isa)
    dnnkit.set_num_threads(threads)
    dnnkit.set_tuning(tuning)
    dnnkit.set_workspace_limit(limit)


@pytest.fixture
def nan_rnn_outputs(monkeypatch):
    """Every array dnnkit.ops.recurrent allocates starts as NaN: an element the kernels never write fails."""
    from dnnkit.ops import recurrent

    def empty_nan(op, shape, dtype):
        return np.full(shape, np.nan, dtype=dtype)
    monkeypatch.setattr(recurrent, "_empty", empty_nan)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The default tuning cache, in a directory of the test's own."""
    from dnnkit.autotune import cache

    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    s = cache.default_store()
    yield s
    s.close()
