"""Tuning records: one candidate's outcome on one problem (TuneRecord), a problem's records best first
(TuneResult), and their table. The cache stores them, the tuner makes them, the cost model fits to them."""
from __future__ import annotations

import dataclasses
import math

# Status of a record, in the order records are ranked after the timed ones.
STATUSES = ("ok", "inaccurate", "failed", "pruned", "over_limit", "unsupported")


@dataclasses.dataclass
class TuneRecord:
    """One candidate's outcome on one problem."""

    algorithm: str
    status: str                         # one of STATUSES
    median_s: float = math.inf          # inf unless status == "ok"
    spread: float | None = None         # (q3 - q1) / median of the timed runs
    reps: int = 0
    gflops: float | None = None
    workspace_bytes: int | None = None
    error: float | None = None          # relative L2 error against the oracle
    tolerance: float | None = None
    reason: str | None = None           # why not ok
    predicted_s: float | None = None    # the cost model's prediction
    inputs: str | None = None           # the operands the timed calls used (rotated copies, or one set)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if math.isinf(d["median_s"]):
            d["median_s"] = None  # JSON has no infinity
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TuneRecord":
        """The record a to_dict() gave; ValueError naming the field where d is not one (a wrong key,
        type or range: a stored or imported record is checked before anything compares its values)."""
        if not isinstance(d, dict):
            raise ValueError(f"not a tuning record: {d!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"not a tuning record: unknown field(s) {sorted(unknown)}")
        if not isinstance(d.get("algorithm"), str) or not d["algorithm"]:
            raise ValueError(f"tuning record: algorithm must be a name, got {d.get('algorithm')!r}")
        if d.get("status") not in STATUSES:
            raise ValueError(f"tuning record {d['algorithm']!r}: status must be one of {STATUSES}, got "
                             f"{d.get('status')!r}")

        def check(name, kind, optional=True):
            v = d.get(name)
            if v is None and optional:
                return
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if kind == "int":
                good = number and isinstance(v, int) and v >= 0
            elif kind == "error":  # an output of NaN or Inf measures as such (an "inaccurate" record)
                good = number and not v < 0
            else:
                good = number and math.isfinite(v) and v >= 0
            if not good:
                want = {"int": "a count", "error": "a number >= 0"}.get(kind, "a finite number >= 0")
                raise ValueError(f"tuning record {d['algorithm']!r}: {name} must be {want}, got {v!r}")

        for name in ("median_s", "spread", "gflops", "tolerance", "predicted_s"):
            check(name, "float")
        check("error", "error")
        check("reps", "int")
        check("workspace_bytes", "int")
        for name in ("reason", "inputs"):
            if d.get(name) is not None and not isinstance(d[name], str):
                raise ValueError(f"tuning record {d['algorithm']!r}: {name} must be text, got {d[name]!r}")
        if d["status"] == "ok" and d.get("median_s") is None:
            raise ValueError(f"tuning record {d['algorithm']!r}: an ok record needs its median_s")
        d = dict(d)
        if d.get("median_s") is None:
            d["median_s"] = math.inf
        return cls(**d)


class TuneResult(list):
    """find()'s answer: TuneRecords best first, with the problem, the time tuning took, and where the
    records came from ("measured" now, or "cache")."""

    def __init__(self, problem, records, elapsed_s: float = 0.0, source: str = "measured"):
        super().__init__(records)
        self.problem = problem
        self.elapsed_s = elapsed_s
        self.source = source

    @property
    def best(self) -> TuneRecord | None:
        return self[0] if self and self[0].ok else None

    def fastest(self, workspace_limit: int | None = None) -> TuneRecord | None:
        """The fastest accurate record whose workspace fits the limit."""
        for r in self:
            if r.ok and (workspace_limit is None or (r.workspace_bytes or 0) <= workspace_limit):
                return r
        return None

    def __str__(self) -> str:
        return format_table(self)


def format_table(result: TuneResult, workspace_limit: int | None = None) -> str:
    """The records as a table, the chosen one marked *: the fastest accurate one, or with workspace_limit
    the fastest whose workspace fits it (as dispatch chooses under that limit)."""
    p = result.problem
    lines = [f"{p.op} {p.descriptor()}" + ("" if p.op == "gemm" else f" {p.dtype}")
             + (f"  ({result.source})" if result.source != "measured" else f"  ({result.elapsed_s:.2f} s)")
             + ("" if workspace_limit is None else f"  workspace limit {format_bytes(workspace_limit)}")]
    lines.append(f"  {'algorithm':<20} {'median ms':>10} {'spread':>7} {'GFLOP/s':>8} {'workspace':>10} "
                 f"{'error':>8} {'pred ms':>8}  status")
    best = result.fastest(workspace_limit)
    for r in result:
        mark = "*" if best is not None and r is best else " "
        med = f"{r.median_s * 1e3:10.3f}" if r.ok else f"{'-':>10}"
        spread = f"{r.spread * 100:6.1f}%" if r.spread is not None else f"{'-':>7}"
        gf = f"{r.gflops:8.1f}" if r.gflops is not None else f"{'-':>8}"
        ws = format_bytes(r.workspace_bytes) if r.workspace_bytes is not None else "-"
        err = f"{r.error:8.1e}" if r.error is not None else f"{'-':>8}"
        pred = f"{r.predicted_s * 1e3:8.3f}" if r.predicted_s is not None else f"{'-':>8}"
        status = r.status if r.reason is None else f"{r.status}: {r.reason}"
        lines.append(f"{mark} {r.algorithm:<20} {med} {spread} {gf} {ws:>10} {err} {pred}  {status}")
    return "\n".join(lines)


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
