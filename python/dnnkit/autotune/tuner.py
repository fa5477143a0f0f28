"""Measured tuning: time every algorithm that supports a problem, check its accuracy, rank them.

find(p) is the autotuner's core and what `measure` mode and `dnnkit autotune` run:
  1. every registered algorithm for p's (op, backend) is a candidate; one that does not support p, or
     needs more workspace than the limit, gets a record saying why and is not run;
  2. with pruning on (the default), a candidate the cost model predicts at more than `prune` times the
     best prediction, and at more than PRUNE_MIN_S, is not timed either ("pruned"); the model's error on
     ResNet-50 is far inside 4x, and a candidate predicted faster than PRUNE_MIN_S costs less to time
     than the model's fixed costs (calls, launches), which its formulas leave out, may be wrong by. On
     the GPU nothing is pruned until every candidate's formula has a factor fitted from this device's
     measurements;
  3. inputs are random (uniform in [-1, 1), never zeros), the same for every candidate. The oracle is
     reference.py's float64 NumPy formula on them, independent of every dnnkit kernel;
  4. each candidate runs once as a warm-up, its output is compared with the oracle (relative L2), and
     one over its tolerance is excluded ("inaccurate"); the others are timed in ROUNDS alternating
     rounds (each round in another order, so that a slow minute of a shared machine falls on all of
     them), each spending its share of the budget a round (at least MIN_REPS runs in all): the median
     is the figure, the interquartile range over the median the spread. Where the fastest's spread is
     over NOISY_SPREAD or the top two are closer than their spreads, those two are timed again in more
     rounds (half the budget). Each call takes the next of several copies of the operands where one
     set fits the last-level cache (_operand_sets; the record's `inputs` says which), so that no call
     finds its operands where the last one left them;
  5. an exception in a candidate (out of memory, a kernel error) is its record's status ("failed") and
     reason: it is scored as infinitely slow and tuning goes on. Inputs or outputs of the problem that do
     not fit in memory fail every candidate that would need them, each record saying so: find() returns
     those records, never the MemoryError.
The records come back best first and are written to the persistent cache (cache.py).
"""
from __future__ import annotations

import math
import time

import numpy as np

from .. import algos
from ..backends import BACKENDS
from .._config import NAN_SEMANTICS, get_nan_semantics, get_workspace_limit
from ..algos.base import settings_reason
from ..reference import rel_l2
from . import harness
from .cost_model import correction_factors, predict
from .records import STATUSES, TuneRecord, TuneResult, format_bytes

DEFAULT_BUDGET_S = 1.0   # timing budget per problem, shared by its candidates
DEFAULT_PRUNE = 4.0      # candidates predicted slower than this times the best prediction are not timed
PRUNE_MIN_S = 10e-6      # ... unless predicted faster than this
MIN_REPS = 3
MAX_REPS = 50
ROUNDS = 3              # candidates are timed in this many alternating rounds
NOISY_SPREAD = 0.25     # a spread (IQR / median) over this, or top two closer than their spreads: re-time
MAX_OPERAND_COPIES = 64
FLOAT64_TOLERANCE = 1e-12

def _backend(p) -> str:
    return "cuda" if p.device == "cuda" else "cpu"


def tolerance(algorithm, dtype: str) -> float:
    """The relative L2 error an algorithm may have on inputs of dtype."""
    return algorithm.tolerance if dtype == "float32" else FLOAT64_TOLERANCE


def _oracle(p, ops, rng):
    """The float64 reference result of p on ops (the harness's, from reference.py), or (None, reason)."""
    try:
        return harness.harness(p).reference(p, ops), None
    except Exception as e:  # noqa: BLE001 - no oracle means no accuracy check, not a failed tuning
        return None, f"no accuracy check ({type(e).__name__}: {e})"


def _operand_sets(p, ops: harness.Operands, rng) -> list:
    """The operand sets the timed calls cycle through: one where a call's operands outgrow the last-level
    cache (they come from memory anyway), else enough copies to fill twice that cache, so that each call
    finds its inputs and output in memory, as a layer inside a network does, not where the previous
    call left them (the classifier of ResNet-50 at batch 1 read 1.9x the copy bandwidth on reused inputs)."""
    nbytes = harness.harness(p).nbytes(p, ops)
    llc = BACKENDS[_backend(p)].last_level_cache_bytes()
    if llc <= 0 or nbytes >= llc:
        return [ops]
    copies = min(MAX_OPERAND_COPIES, -(-2 * llc // max(nbytes, 1)))
    return [ops] + [harness.operands(p, rng) for _ in range(copies - 1)]


def _timing_operands(p, h, ops, rng, timed) -> tuple[list, list]:
    """(operand sets, an output for each) for the timed calls: fewer copies where more do not fit in memory;
    where not even one output fits, the timed candidates are failed (the problem's failure, each record
    saying why) and there are no outputs."""
    if not timed:
        return [ops], []
    try:
        sets = _operand_sets(p, ops, rng)
    except MemoryError:
        sets = [ops]
    for attempt in (sets, [ops]):
        try:
            return attempt, [h.output(p, ops) for _ in attempt]
        except MemoryError as e:
            error = e
    for _, r, _ in timed:
        r.status, r.reason = "failed", f"outputs do not fit in memory (MemoryError: {error})"
    return [ops], []


def _time_rounds(entries, p, sets, outs, budget_s: float, rounds: int) -> None:
    """Times the candidates in `rounds` alternating rounds (each round in another order), each taking its
    share of budget_s; every call on the next operand set. Appends to each entry's list of times; a
    candidate that raises is marked failed and leaves the rounds."""
    if not entries:
        return
    share = budget_s / len(entries) / rounds
    h = harness.harness(p)
    clock = BACKENDS[_backend(p)].time_call
    for r in range(rounds):
        order = entries[r % len(entries):] + entries[:r % len(entries)]
        for a, rec, times in order:
            if rec.status != "ok":
                continue
            start = time.perf_counter()
            want = -(-MIN_REPS // rounds)  # at least MIN_REPS over the rounds
            try:
                while len(times) < MAX_REPS * rounds:
                    i = len(times) % len(sets)
                    times.append(clock(lambda: h.run(a, p, sets[i], outs[i], rec.workspace_bytes)))
                    want -= 1
                    if want <= 0 and time.perf_counter() - start >= share:
                        break
            except Exception as e:  # noqa: BLE001 - scored as infinitely slow, tuning goes on
                rec.status, rec.reason = "failed", f"{type(e).__name__}: {e}"


def _stats(times) -> tuple[float, float]:
    q1, med, q3 = np.percentile(times, [25, 50, 75])
    return float(med), float((q3 - q1) / med) if med > 0 else 0.0


def _rank(r: TuneRecord):
    return (STATUSES.index(r.status), r.median_s, r.predicted_s if r.predicted_s is not None else math.inf)


def find(p, *, budget: float | None = None, workspace_limit: int | None = None, prune: float | None = DEFAULT_PRUNE,
         seed: int = 0, store=True, exclude=(), nan_semantics: str | None = None) -> TuneResult:
    """Time every algorithm that supports problem p; records best first (see the module docstring).

    budget: seconds of timing for the whole problem (default DEFAULT_BUDGET_S), shared by the candidates
        that are timed; each is still run at least MIN_REPS times after its warm-up.
    workspace_limit: bytes (default: dnnkit.get_workspace_limit()); algorithms needing more are not run.
    prune: a candidate predicted slower than prune x the best prediction is not timed; None times all.
    store: True writes the records to the default cache, a cache.Store writes there, False nowhere.
    exclude: algorithm names not to run (recorded as unsupported, "excluded").
    nan_semantics: "strict" (default: dnnkit.get_nan_semantics()) leaves out the algorithms that do not
        propagate NaN and Inf exactly (unsupported) and checks the others on inputs with a NaN and an Inf
        planted in them: one whose NaN, +Inf and -Inf differ from the reference's is "inaccurate".
    """
    h = harness.harness(p)  # ValueError where p's operator is not tunable
    if budget is None:
        budget = DEFAULT_BUDGET_S
    if not (isinstance(budget, (int, float)) and budget >= 0) or isinstance(budget, bool):
        raise ValueError(f"autotune: budget must be a number of seconds >= 0, got {budget!r}")
    if prune is not None and not (isinstance(prune, (int, float)) and prune >= 1):
        raise ValueError(f"autotune: prune must be None or a factor >= 1, got {prune!r}")
    limit = get_workspace_limit() if workspace_limit is None else workspace_limit
    nan_semantics = get_nan_semantics() if nan_semantics is None else nan_semantics
    if nan_semantics not in NAN_SEMANTICS:
        raise ValueError(f"autotune: nan_semantics must be one of {NAN_SEMANTICS}, got {nan_semantics!r}")
    strict = nan_semantics == "strict"
    t_start = time.perf_counter()

    registered = algos.algorithms(p.op, _backend(p))
    if not registered:
        raise ValueError(f"autotune: no {_backend(p)} algorithm exists for {p.op} yet ({p.descriptor()})")
    records, runnable = [], []
    for a in registered:
        if a.name in exclude:
            records.append(TuneRecord(a.name, "unsupported", reason="excluded"))
            continue
        try:
            reason = a.supports(p) or settings_reason(a, strict)
            ws = None if reason else int(a.workspace_bytes(p))
        except Exception as e:  # noqa: BLE001 - a broken supports() is this candidate's failure only
            records.append(TuneRecord(a.name, "failed", reason=f"{type(e).__name__}: {e}"))
            continue
        if reason:
            records.append(TuneRecord(a.name, "unsupported", reason=reason))
        elif limit is not None and ws > limit:
            records.append(TuneRecord(a.name, "over_limit", workspace_bytes=ws,
                                      reason=f"needs {format_bytes(ws)} of workspace, over the limit of {format_bytes(limit)}"))
        else:
            rec = TuneRecord(a.name, "ok", workspace_bytes=ws, tolerance=tolerance(a, p.dtype),
                             predicted_s=predict(a, p))
            runnable.append((a, rec))

    predictions = [r.predicted_s for _, r in runnable if r.predicted_s is not None]
    if prune is not None and _backend(p) == "cuda":
        fitted = correction_factors("cuda")
        if not all((p.op, a.name) in fitted for a, _ in runnable):
            prune = None  # the GPU formulas are nominal until this device's measurements have scaled them
    if prune is not None and len(predictions) >= 2:
        cut = prune * min(predictions)
        kept = []
        for a, r in runnable:
            if r.predicted_s is not None and r.predicted_s > max(cut, PRUNE_MIN_S):
                r.status = "pruned"
                r.reason = f"predicted {r.predicted_s * 1e3:.2f} ms, over {prune:g}x the best prediction"
                records.append(r)
            else:
                kept.append((a, r))
        runnable = kept

    if runnable:
        rng = np.random.default_rng(seed)
        try:
            ops = harness.operands(p, rng)
            expected, oracle_note = _oracle(p, ops, rng)
            planted = h.with_nonfinite(p, ops) if strict else None
            if planted is not None:
                with np.errstate(all="ignore"):
                    expected_nonfinite = h.reference(p, planted)
        except MemoryError as e:
            ops = None
            for a, r in runnable:
                r.status, r.reason = "failed", f"inputs do not fit in memory ({e})"
        if ops is not None:
            # The accuracy check, once per candidate, on the first operand set.
            timed = []
            for a, r in runnable:
                try:
                    out = h.output(p, ops, fill=np.nan)  # NaN: a kernel that skips a write shows
                    h.run(a, p, ops, out, r.workspace_bytes)
                    if expected is not None:
                        r.error = rel_l2(h.result(p, out), expected)
                        if not r.error <= r.tolerance:
                            r.status = "inaccurate"
                            r.reason = f"error {r.error:.1e} over the tolerance {r.tolerance:.0e}"
                            continue
                    if planted is not None:
                        out = h.output(p, planted, fill=0.0)
                        h.run(a, p, planted, out, r.workspace_bytes)
                        if not harness.same_nonfinite(h.result(p, out), expected_nonfinite):
                            r.status = "inaccurate"
                            r.reason = "NaN and Inf in the inputs do not reach the outputs as in the reference"
                            continue
                    else:
                        r.reason = oracle_note
                    timed.append((a, r, []))
                except Exception as e:  # noqa: BLE001 - scored as infinitely slow, tuning goes on
                    r.status, r.reason = "failed", f"{type(e).__name__}: {e}"
            sets, outs = _timing_operands(p, h, ops, rng, timed)
            inputs = f"rotated over {len(sets)} copies" if len(sets) > 1 else "one set (larger than the cache)"
            # Alternating rounds; the top two again where the figures do not tell them apart.
            live = list(timed) if outs else []
            for extra in (False, True):
                _time_rounds(live, p, sets, outs, budget / 2 if extra else budget, ROUNDS)
                if extra:
                    break
                ranked = sorted(((_stats(x[2]), x) for x in timed if x[1].status == "ok" and x[2]),
                                key=lambda e: e[0][0])
                if not ranked:
                    break
                (m1, s1), (m2, s2) = ranked[0][0], ranked[1][0] if len(ranked) > 1 else (math.inf, 0.0)
                if m2 - m1 >= max(s1, s2) * m1 and s1 <= NOISY_SPREAD:
                    break  # the fastest is told apart from the next
                live = [x for _, x in ranked[:2]]
            for a, r, times in timed:
                if r.status != "ok" or not times:
                    continue
                med, spread = _stats(times)
                r.median_s, r.reps, r.spread = med, len(times), spread
                r.gflops = p.flops / med / 1e9 if med > 0 else None
                r.inputs = inputs
        records.extend(r for _, r in runnable)

    result = TuneResult(p, sorted(records, key=_rank), time.perf_counter() - t_start)
    if store is not False:
        from . import cache

        (cache.default_store() if store is True else store).put(result)
    return result
