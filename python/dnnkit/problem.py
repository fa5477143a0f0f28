"""Problems: frozen, hashable descriptions of one operator call, printable and parseable as one-line
descriptors (usable in files, on the command line and as cache keys).

GEMM descriptor grammar (fields that equal their default may be left out):
    m<M>n<N>k<K>[ta][tb][_bias][_<activation>]_<dtype>[_<device>]
e.g. "m64n4096k4096tb_bias_relu_f32". Dimension letters follow BLAS: C is M x N, the inner size is K.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = {"f32": "float32", "f64": "float64"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
ACTIVATIONS = ("identity", "relu", "tanh", "sigmoid", "gelu")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class GemmProblem:
    """C (M x N) := act(alpha * op(A) op(B) + beta * C + bias), op(A) M x K, op(B) K x N."""

    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False
    dtype: str = "float32"
    bias: bool = False
    activation: str = "identity"
    device: str = "cpu"
    op: str = "gemm"

    def __post_init__(self):
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"GemmProblem: {name} must be an int >= 0, got {v!r}")
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"GemmProblem: dtype must be one of {tuple(DTYPE_CODES)}, got {self.dtype!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"GemmProblem: activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.device not in DEVICES:
            raise ValueError(f"GemmProblem: device must be one of {DEVICES}, got {self.device!r}")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8

    def descriptor(self) -> str:
        s = f"m{self.m}n{self.n}k{self.k}"
        s += "ta" if self.trans_a else ""
        s += "tb" if self.trans_b else ""
        s += "_bias" if self.bias else ""
        s += f"_{self.activation}" if self.activation != "identity" else ""
        s += f"_{DTYPE_CODES[self.dtype]}"
        s += f"_{self.device}" if self.device != "cpu" else ""
        return s

    __str__ = descriptor

    _RE = re.compile(
        r"^m(?P<m>\d+)n(?P<n>\d+)k(?P<k>\d+)(?P<ta>ta)?(?P<tb>tb)?"
        r"(?P<bias>_bias)?(?:_(?P<act>identity|relu|tanh|sigmoid|gelu))?"
        r"(?:_(?P<dt>f32|f64))?(?:_(?P<dev>cpu|cuda))?$"
    )

    @classmethod
    def parse(cls, text: str) -> "GemmProblem":
        match = cls._RE.match(text.strip())
        if not match:
            raise ValueError(
                f"GemmProblem.parse: cannot parse {text!r}; expected m<M>n<N>k<K>[ta][tb][_bias][_act][_f32|_f64]"
            )
        g = match.groupdict()
        return cls(
            m=int(g["m"]), n=int(g["n"]), k=int(g["k"]), trans_a=bool(g["ta"]), trans_b=bool(g["tb"]),
            bias=bool(g["bias"]), activation=g["act"] or "identity", dtype=DTYPES[g["dt"] or "f32"],
            device=g["dev"] or "cpu",
        )
