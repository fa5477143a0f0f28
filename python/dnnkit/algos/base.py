"""The Algorithm contract (see DESIGN.md)."""
from __future__ import annotations

from dataclasses import dataclass


class Algorithm:
    """One way to compute a Problem.

    name:      carries geometry and backend ("blocked_gemm", "winograd_f4x4_3x3")
    op:        the operator and direction ("gemm", "conv2d_fwd", ...)
    backend:   "cpu" or "cuda"
    tolerance: bound on the relative L2 error against the float64 reference, for float32 inputs
    nonfinite: what a NaN or Inf in the inputs does to the outputs (NONFINITE): "exact" where the
               reference has NaN or +-Inf, the same, and nowhere else; "tiles" the outputs of every
               transform tile it reaches are NaN (Winograd: Inf - Inf in the transforms); "all" every
               output of the image is NaN (FFT: the transform mixes all points)
    tf32:      whether it rounds float32 operands to TF32 for the tensor cores; dispatch and the tuner take
               it only where dnnkit.set_allow_tf32(True) (or DNNKIT_ALLOW_TF32=1) allows, algo= always
    """

    name: str = ""
    op: str = ""
    backend: str = "cpu"
    tolerance: float = 1e-5
    nonfinite: str = "exact"
    tf32: bool = False  # rounds float32 operands to TF32: chosen only where allowed (set_allow_tf32) or named

    def supports(self, p) -> str | None:
        """None when this algorithm can run p, else the reason it cannot (never a matter of speed: see rule)."""
        raise NotImplementedError

    def rule(self, p) -> str | None:
        """None where the built-in rule takes this algorithm for p when nothing measured decides (no tuning
        record, no cost-model prediction), else why not ("the blocked GEMM is faster there"). Unlike
        supports(), a rule never keeps the tuner from timing the algorithm, nor algo= from naming it."""
        return None

    def workspace_bytes(self, p) -> int:
        """Extra memory run() needs for p, known before running."""
        return 0

    def cost(self, p, c: "Ceilings") -> float | None:
        """Predicted seconds for p (which it supports) on a device with ceilings c: the operations over the
        peak and the bytes its passes move over the bandwidth, each at this algorithm's efficiency; None
        where it has no formula (dispatch then keeps the registry's order). The cost model
        (autotune/cost_model.py) scales it by a factor fitted to this device's measurements."""
        return None

    def run(self, p, *arrays, out=None, **params):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Algorithm {self.op}/{self.backend}/{self.name}>"


@dataclass(frozen=True)
class Ceilings:
    """What a cost() formula scales by: the device's float32 peak (FLOP/s, every thread or SM), its
    bandwidth for streaming copies (bytes/s per thread on the CPU, the whole DRAM's on the GPU), the threads
    a CPU call runs on, and the tensor cores' TF32 rate (0: none). float64 runs at half the float32 rate on
    every device dnnkit targets (AVX2/AVX-512 vectors hold half as many; an H100's FP64 units are half its
    FP32 ones)."""

    peak_flops: float
    bytes_per_s: float
    threads: int = 1
    tf32_flops: float = 0.0

    def peak(self, p) -> float:
        """The peak for p's dtype."""
        return self.peak_flops if p.itemsize == 4 else self.peak_flops / 2

    @property
    def bandwidth(self) -> float:
        """Streaming bandwidth of all the threads of a call."""
        return self.bytes_per_s * self.threads


NONFINITE = {
    "exact": "propagated as the reference does",
    "tiles": "a NaN or Inf makes every output of the transform tiles it reaches NaN",
    "all": "a NaN or Inf makes every output of its image NaN",
}


TF32_NOT_ALLOWED = "rounds float32 operands to TF32; allow it with dnnkit.set_allow_tf32(True) or DNNKIT_ALLOW_TF32=1"


def settings_reason(algo: Algorithm, strict_nan: bool) -> str | None:
    """Why the process's settings keep algo out of dispatch's and the tuner's choice (it can run the
    problem): NaN semantics "strict" and an algorithm that does not propagate NaN and Inf exactly; TF32
    not allowed and an algorithm that rounds to it. None when they do not."""
    from .._config import get_allow_tf32

    if strict_nan and algo.nonfinite != "exact":
        return f"NaN and Inf: {NONFINITE[algo.nonfinite]} (nan_semantics is strict)"
    if algo.tf32 and not get_allow_tf32():
        return TF32_NOT_ALLOWED
    return None


def cpu_float_reason(p) -> str | None:
    """The reason a CPU float32/float64 kernel cannot run p, or None."""
    if p.device != "cpu":
        return f"runs on the CPU, the problem is on {p.device}"
    if p.dtype not in ("float32", "float64"):
        return f"dtype {p.dtype} is not float32 or float64"
    return None


@dataclass(frozen=True)
class Candidate:
    """One line of explain(): an algorithm, and whether (and why not) it can run a problem."""

    algorithm: str
    supported: bool
    reason: str | None
    workspace_bytes: int | None
    chosen: bool = False
    rule: str | None = None           # why the built-in rule does not take it (see Algorithm.rule), if it does not
    nonfinite: str = "exact"          # Algorithm.nonfinite
    predicted_s: float | None = None  # the cost model's prediction, when it has one
    measured_s: float | None = None   # the tuning cache's median, when this problem was tuned here

    def __str__(self) -> str:
        mark = "*" if self.chosen else " "
        if self.supported:
            pred = "" if self.predicted_s is None else f"  predicted {self.predicted_s * 1e3:.3f} ms"
            if self.measured_s is not None:
                pred += f"  measured {self.measured_s * 1e3:.3f} ms"
            rule = "" if self.rule is None else f"  (rule: {self.rule})"
            nf = "" if self.nonfinite == "exact" else f"  (NaN/Inf: {self.nonfinite})"
            return f"{mark} {self.algorithm:<24} supported  workspace {self.workspace_bytes} B{pred}{rule}{nf}"
        return f"{mark} {self.algorithm:<24} rejected   {self.reason}"
