"""Chooses the algorithm for a problem: an explicit algo= > a cached tuning result > the tuning mode.

A cached tuning result is the fastest accurate algorithm the persistent cache (autotune/cache.py) holds
for this problem, device and version whose workspace fits the limit. Without one, the tuning mode
(dnnkit.set_tuning) decides: "measure" tunes the problem now (autotune.find, stored in the cache, like
cudnn.benchmark); "heuristic" takes, among the supporting algorithms that fit the workspace limit and that
their built-in rule takes (Algorithm.rule), the one the cost model (autotune/cost_model.py) predicts
fastest, keeping the registry's order where it has no prediction; "off" takes the first of them in the
registry's order. Where no rule takes any, the supporting ones all stand.

A decision is a Plan (plans.py): the algorithm, its workspace and its run() bound to the problem,
remembered per process (keyed by everything it depends on), so a repeated call costs a dictionary lookup.
"""
from __future__ import annotations

import warnings

from . import algos
from .backends import cpu as _cpu
from ._config import _generation, algo_overrides, get_nan_semantics, get_tuning, get_workspace_limit
from .plans import Memo, Plan
from .autotune import cache
from .autotune.cost_model import predict
from .algos.base import TF32_NOT_ALLOWED, Algorithm, Candidate, settings_reason


def _backend(p) -> str:
    return "cuda" if p.device == "cuda" else "cpu"


def candidates(p, workspace_limit: int | None = None) -> list[tuple[Algorithm, str | None, int | None]]:
    """Every registered algorithm for p's (op, backend) with the reason it cannot run p (None if it can)
    and its workspace. An algorithm needing more than the workspace limit is rejected with that reason, and
    one the settings keep out (algos.base.settings_reason: strict NaN semantics, TF32 not allowed)."""
    limit = get_workspace_limit() if workspace_limit is None else workspace_limit
    strict = get_nan_semantics() == "strict"
    out = []
    for algo in algos.algorithms(p.op, _backend(p)):
        reason = algo.supports(p)
        if reason is None:
            reason = settings_reason(algo, strict)
        ws = None
        if reason is None:
            ws = algo.workspace_bytes(p)
            if limit is not None and ws > limit:
                reason = f"needs {ws} B of workspace, over the limit of {limit} B"
        out.append((algo, reason, ws))
    return out


# Plans already made: (problem, algo, workspace limit, dispatch_state()) -> Plan.
_plans = Memo()


def dispatch_state() -> tuple:
    """What a dispatch decision depends on besides the problem, the algo argument and an explicit
    workspace limit, as two counts: one bumped by every change on the Python side (the registry, the
    tuning mode, the NaN semantics, TF32's permission, the process-wide workspace limit, the tuning
    cache's writes: _config.changed), one by the extension's settings a cached record is keyed by on this
    machine (the thread count, the active ISA, AMX tiles on or off)."""
    return _generation[0], _settings_generation()


_settings_generation = _cpu.settings_generation

# DNNKIT_ALGO_<OP>: the algorithm "auto" names for an operator (read at import).
_OVERRIDES = algo_overrides()


def plan(p, algo: str | Algorithm = "auto", workspace_limit: int | None = None) -> Plan:
    """The Plan that runs p: the algorithm algo names (for "auto", DNNKIT_ALGO_<OP> where set), or the one
    dispatch chooses among those whose workspace fits workspace_limit (default: the process-wide limit).
    Raises ValueError naming the operator when none can."""
    if not isinstance(algo, (str, Algorithm)):  # before it is hashed into the key
        raise TypeError(f"{p.op}: algo must be 'auto', an algorithm name or an Algorithm, got {type(algo).__name__}")
    limit = get_workspace_limit() if workspace_limit is None else workspace_limit
    key = (p, algo, limit, dispatch_state())
    hit = _plans.get(key)
    if hit is not None:
        return hit
    if algo == "auto" and p.op in _OVERRIDES:
        try:
            return _plans.put(key, Plan.of(p, _choose(p, _OVERRIDES[p.op], limit)))
        except ValueError as e:
            raise ValueError(f"{e} (from DNNKIT_ALGO_{p.op.upper()})") from None
    return _plans.put(key, Plan.of(p, _choose(p, algo, limit)))


def choose(p, algo: str | Algorithm = "auto", workspace_limit: int | None = None) -> Algorithm:
    """The algorithm that runs p (plan(p, ...).algorithm)."""
    return plan(p, algo, workspace_limit).algorithm


def _choose(p, algo, workspace_limit) -> Algorithm:
    if isinstance(algo, Algorithm):
        if (algo.op, algo.backend) != (p.op, _backend(p)):
            raise ValueError(f"{p.op}: algo {algo.name!r} is a {algo.backend} {algo.op} algorithm; this call needs "
                             f"a {_backend(p)} {p.op} one")
        reason = algo.supports(p)
        if reason is not None:
            raise ValueError(f"{p.op}: algo {algo.name!r} does not support {p.descriptor()}: {reason}")
        return algo
    cands = candidates(p, workspace_limit)
    if algo != "auto":
        for a, reason, _ in cands:
            if a.name == algo:
                if reason is not None and reason != TF32_NOT_ALLOWED:  # naming a TF32 algorithm allows it
                    raise ValueError(f"{p.op}: algo {algo!r} cannot run {p.descriptor()}: {reason}")
                return a
        known = [a.name for a, _, _ in cands]
        raise ValueError(f"{p.op}: algo must be 'auto' or one of {known}, got {algo!r}")
    supported = [a for a, reason, _ in cands if reason is None]
    if supported:
        tuned = _tuned(p, supported, workspace_limit)
        if tuned is not None:
            return tuned
    if supported and get_tuning() == "measure":
        measured = _measure(p, supported, workspace_limit)
        if measured is not None:
            return measured
    ruled = [a for a in supported if a.rule(p) is None] or supported
    if ruled and get_tuning() != "off":
        predicted = [(t, i, a) for i, a in enumerate(ruled) if (t := predict(a, p)) is not None]
        if predicted:
            return min(predicted, key=lambda tia: (tia[0], tia[1]))[2]
    if ruled:
        return ruled[0]
    if not cands:
        raise ValueError(f"{p.op}: no {_backend(p)} algorithm exists for this operator yet ({p.descriptor()})")
    reasons = "; ".join(f"{a.name}: {r}" for a, r, _ in cands)
    raise ValueError(f"{p.op}: no algorithm supports {p.descriptor()} ({reasons})")


def _by_name(result, supported, workspace_limit):
    """The fastest accurate record of result within the limit that names a supported algorithm (a
    record of an algorithm this build does not have gives way to the next, not to re-tuning). None where
    the result was tuned under a tighter workspace limit than this one: a candidate it left untimed
    (over_limit) fits here, so its choice is not this limit's."""
    if result is None:
        return None
    if any(r.status == "over_limit" and (workspace_limit is None or (r.workspace_bytes or 0) <= workspace_limit)
           for r in result):
        return None
    by_name = {a.name: a for a in supported}
    for r in result:
        if r.ok and r.algorithm in by_name and (workspace_limit is None or (r.workspace_bytes or 0) <= workspace_limit):
            return by_name[r.algorithm]
    return None


def cached_result(p):
    """The tuning result the cache holds for p on this device and version, or None. A cache that cannot
    be read is a miss (with a warning), never an error."""
    try:
        return cache.default_store().get(p)
    except Exception as e:  # noqa: BLE001 - the cache must never break a call
        warnings.warn(f"dnnkit: tuning cache lookup failed ({type(e).__name__}: {e}); not using it",
                      RuntimeWarning, stacklevel=4)
        return None


def _tuned(p, supported, workspace_limit):
    return _by_name(cached_result(p), supported, workspace_limit)


def _measure(p, supported, workspace_limit):
    """measure mode on a cache miss: tune p now (the result goes to the cache)."""
    from .autotune.tuner import find

    try:
        result = find(p, workspace_limit=workspace_limit)
    except Exception as e:  # noqa: BLE001 - tuning trouble falls back to the heuristic, never fails the call
        warnings.warn(f"dnnkit: tuning {p.op} {p.descriptor()} failed ({type(e).__name__}: {e}); "
                      "using the cost model", RuntimeWarning, stacklevel=4)
        return None
    return _by_name(result, supported, workspace_limit)


def explain_problem(p, algo: str = "auto", workspace_limit: int | None = None) -> list[Candidate]:
    """One Candidate per registered algorithm: supported or why not, workspace, and which is chosen."""
    try:
        chosen = choose(p, algo, workspace_limit).name
    except ValueError:
        chosen = None
    measured = {}
    result = cached_result(p)
    for r in result or ():
        if r.ok:
            measured[r.algorithm] = r.median_s
    return [
        Candidate(a.name, reason is None, reason, ws, chosen=(a.name == chosen),
                  rule=a.rule(p) if reason is None else None, nonfinite=a.nonfinite,
                  predicted_s=predict(a, p) if reason is None else None, measured_s=measured.get(a.name))
        for a, reason, ws in candidates(p, workspace_limit)
    ]
