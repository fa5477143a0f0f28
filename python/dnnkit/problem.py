"""Problems: frozen, hashable descriptions of one operator call, printable and parseable as one-line
descriptors (usable in files, on the command line and as cache keys).

GEMM descriptor grammar (fields that equal their default may be left out):
    m<M>n<N>k<K>[ta][tb][_bias][_<activation>]_<dtype>[_<device>]
e.g. "m64n4096k4096tb_bias_relu_f32". Dimension letters follow BLAS: C is M x N, the inner size is K.

Convolution descriptors use oneDNN benchdnn's grammar (see ConvProblem.parse), e.g.
    g1mb8ic64ih56iw56oc64oh56ow56kh3kw3sh1sw1ph1pw1dh0dw0n"resnet_50:res2a_branch2b*3"
and files of them, one a line, are read by load_problems().

RNN descriptor grammar (RnnProblem), after benchdnn's rnn fields:
    <mode>_l<layers>t<steps>mb<batch>slc<input>sic<hidden>[_bidir][_nobias][_<dtype>]
e.g. "lstm_l2t50mb16slc512sic512_bidir_f32"; mode is lstm, gru, rnn_tanh or rnn_relu.
"""
from __future__ import annotations

import dataclasses

import numbers
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

DTYPES = {"f32": "float32", "f64": "float64"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
ACTIVATIONS = ("identity", "relu", "tanh", "sigmoid", "gelu")
DEVICES = ("cpu", "cuda")
# The largest size a problem takes in any one field (a dimension, a stride, a padding, a dilation), as
# BLAS's and cuBLAS's int arguments: the kernels' sizing rules multiply fields in 64-bit integers.
MAX_SIZE = 2**31 - 1
# A convolution's padded input (mb x ic x (ih + 2 ph) x (iw + 2 pw)) and its multiply-adds are bounded so
# that the kernels' products of sizes never overflow 64 bits (csrc/bindings/conv.cpp conv_shape checks the
# same bounds).
MAX_CONV_PADDED_INPUT = 2**50
MAX_CONV_MACS = 2**62
# An RNN's layers (each has its own weights; the cost formulas visit each layer).
MAX_RNN_LAYERS = 2**16


def shown(v, limit: int = 80, typed: bool = False) -> str:
    """A value as an error message quotes it: an array (anything with a shape and a dtype) by its type,
    shape and dtype, anything else by its repr (after its type's name with typed), cut to about `limit`
    characters."""
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(v).__name__} of shape {tuple(shape)}, dtype {dtype}"
    text = repr(v)
    text = text if len(text) <= limit else text[:limit] + " ..."
    return f"{type(v).__name__} {text}" if typed else text


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
    packed: bool = False  # op(b) is a weight packed by dnnkit.pack_weight (linear's layout: trans_b)

    def __post_init__(self):
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"GemmProblem: {name} must be an int >= 0, got {v!r}")
            if v > MAX_SIZE:
                raise ValueError(f"GemmProblem: {name} must be at most {MAX_SIZE}, got {v}")
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"GemmProblem: dtype must be one of {tuple(DTYPE_CODES)}, got {self.dtype!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"GemmProblem: activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.device not in DEVICES:
            raise ValueError(f"GemmProblem: device must be one of {DEVICES}, got {self.device!r}")
        if self.packed and (self.trans_a or not self.trans_b or self.device != "cpu"):
            raise ValueError("GemmProblem: a packed weight is linear's operand (trans_b, not trans_a) on the CPU")

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
        s += "_packed" if self.packed else ""
        s += "_bias" if self.bias else ""
        s += f"_{self.activation}" if self.activation != "identity" else ""
        s += f"_{DTYPE_CODES[self.dtype]}"
        s += f"_{self.device}" if self.device != "cpu" else ""
        return s

    __str__ = descriptor

    _RE = re.compile(
        r"^m(?P<m>\d+)n(?P<n>\d+)k(?P<k>\d+)(?P<ta>ta)?(?P<tb>tb)?(?P<packed>_packed)?"
        r"(?P<bias>_bias)?(?:_(?P<act>identity|relu|tanh|sigmoid|gelu))?"
        r"(?:_(?P<dt>f32|f64))?(?:_(?P<dev>cpu|cuda))?$"
    )

    @classmethod
    def parse(cls, text: str) -> "GemmProblem":
        match = cls._RE.match(text.strip())
        if not match:
            raise ValueError(
                f"GemmProblem.parse: cannot parse {text!r}; expected m<M>n<N>k<K>[ta][tb][_packed][_bias][_act][_f32|_f64]"
            )
        g = match.groupdict()
        return cls(
            m=int(g["m"]), n=int(g["n"]), k=int(g["k"]), trans_a=bool(g["ta"]), trans_b=bool(g["tb"]),
            bias=bool(g["bias"]), activation=g["act"] or "identity", dtype=DTYPES[g["dt"] or "f32"],
            device=g["dev"] or "cpu", packed=bool(g["packed"]),
        )


# ---------------------------------------------------------------------------------------------- conv2d
CONV_DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")
CONV_DTYPES = ("float32", "float64")
DATA_DIR = Path(__file__).resolve().parent / "data"  # workload files shipped with the package

# The descriptor's integer fields in benchdnn's canonical order.
_CONV_INTS = ("g", "mb", "ic", "ih", "iw", "oc", "oh", "ow", "kh", "kw", "sh", "sw", "ph", "pw", "dh", "dw")
_CONV_MIN = {"mb": 0, "ph": 0, "pw": 0, "dh": 0, "dw": 0}  # every other field but oh/ow must be >= 1
# One spatial dimension's fields in benchdnn's order: output, input, kernel, stride, padding, dilation.
_SPATIAL = ("o", "i", "k", "s", "p", "d")
# The values benchdnn gives a spatial dimension that a descriptor leaves out entirely (a 1-D problem's h).
_ABSENT_DIM = {"o": 1, "i": 1, "k": 1, "s": 1, "p": 0, "d": 0}
_DEPTH_FIELDS = ("id", "od", "kd", "sd", "pd", "dd")
_CONV_TOKEN = re.compile(r"(g|mb|ic|oc|[iokspd][dhw])(\d+)")


def conv_output_size(i: int, k: int, s: int, p: int, d: int) -> int:
    """Output length along one spatial dimension: (i + 2p - ((k - 1)(d + 1) + 1)) // s + 1, the floor
    rule of torch.nn.functional.conv2d, with d the 0-based (benchdnn) dilation. <= 0 when the kernel's
    extent (k - 1)(d + 1) + 1 exceeds the padded input i + 2p."""
    return (i + 2 * p - ((k - 1) * (d + 1) + 1)) // s + 1


def _trunc_div(a: int, b: int) -> int:
    """a / b rounded toward zero, as C's integer division (benchdnn's padding rule relies on it)."""
    q = abs(a) // b
    return q if a >= 0 else -q


@dataclass(frozen=True)
class ConvProblem:
    """One 2-D convolution, NCHW: input (mb, ic, ih, iw), weight (oc, ic/g, kh, kw), output (mb, oc, oh, ow).

    The integer fields are benchdnn's: g groups, mb minibatch, i*/o* input/output sizes, k* kernel,
    s* stride, p* padding (the same on both sides), d* dilation stored 0-based as benchdnn does (0 is a
    dense kernel; torch's dilation is d + 1). The output size must follow torch's floor rule
    oh == (ih + 2*ph - ((kh-1)*(dh+1)+1)) // sh + 1 (and the same for w); asymmetric padding, which
    benchdnn can express through an explicit oh, is not representable and is rejected.

    name, direction ("fwd", "bwd_data", "bwd_filter"), dtype ("float32", "float64"), bias and device
    ("cpu", "cuda") complete the problem. Only the integer fields and the name are in the descriptor;
    direction, dtype, bias and device are given to parse() separately.
    """

    g: int
    mb: int
    ic: int
    ih: int
    iw: int
    oc: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    name: str = ""
    direction: str = "fwd"
    dtype: str = "float32"
    bias: bool = False
    device: str = "cpu"

    def __post_init__(self):
        for f in _CONV_INTS:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"ConvProblem: {f} must be an int, got {v!r}")
            if type(v) is not int:
                object.__setattr__(self, f, int(v))  # NumPy integers: one hash and one repr for equal problems
            lo = _CONV_MIN.get(f, 1)
            if f not in ("oh", "ow") and v < lo:
                raise ValueError(f"ConvProblem: {f} must be >= {lo}, got {v}")
            if v > MAX_SIZE:
                raise ValueError(f"ConvProblem: {f} must be at most {MAX_SIZE}, got {v}")
        for f in ("ic", "oc"):
            if getattr(self, f) % self.g:
                raise ValueError(f"ConvProblem: {f} ({getattr(self, f)}) must be divisible by g ({self.g})")
        for x in "hw":
            o, i, k, s, p, d = (getattr(self, c + x) for c in _SPATIAL)
            extent = (k - 1) * (d + 1) + 1
            if extent > i + 2 * p:
                raise ValueError(
                    f"ConvProblem: the kernel does not fit: k{x}={k} with d{x}={d} spans {extent} but "
                    f"i{x} + 2*p{x} = {i + 2 * p}, so o{x} would be {conv_output_size(i, k, s, p, d)} <= 0"
                )
            expect = conv_output_size(i, k, s, p, d)
            if o != expect:
                raise ValueError(
                    f"ConvProblem: o{x}={o} does not match the input: (i{x} + 2*p{x} - ((k{x}-1)*(d{x}+1)+1)) "
                    f"// s{x} + 1 = {expect}; only the same padding p{x} on both sides is supported"
                )
        padded = self.mb * self.ic * (self.ih + 2 * self.ph) * (self.iw + 2 * self.pw)
        if padded > MAX_CONV_PADDED_INPUT:
            raise ValueError(f"ConvProblem: the padded input, mb x ic x (ih + 2*ph) x (iw + 2*pw) = {padded} "
                             f"elements, exceeds {MAX_CONV_PADDED_INPUT} (2^50)")
        macs = self.mb * self.oc * (self.ic // self.g) * self.kh * self.kw * self.oh * self.ow
        if macs > MAX_CONV_MACS:
            raise ValueError(f"ConvProblem: {macs} multiply-adds (mb x oc x ic/g x kh x kw x oh x ow) exceed "
                             f"{MAX_CONV_MACS} (2^62)")
        if not isinstance(self.name, str):
            raise ValueError(f"ConvProblem: name must be a str, got {type(self.name).__name__}")
        if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in self.name):
            raise ValueError(f"ConvProblem: name must not contain control characters or line breaks (a descriptor "
                             f"is one line), got {self.name!r}")
        if '"' in self.name:
            raise ValueError(f"ConvProblem: name must not contain '\"' (it delimits the name in a descriptor), "
                             f"got {self.name!r}")
        if self.direction not in CONV_DIRECTIONS:
            raise ValueError(f"ConvProblem: direction must be one of {CONV_DIRECTIONS}, got {self.direction!r}")
        if self.dtype not in CONV_DTYPES:
            raise ValueError(f"ConvProblem: dtype must be one of {CONV_DTYPES}, got {self.dtype!r}")
        if not isinstance(self.bias, bool):
            raise ValueError(f"ConvProblem: bias must be a bool, got {self.bias!r}")
        if self.device not in DEVICES:
            raise ValueError(f"ConvProblem: device must be one of {DEVICES}, got {self.device!r}")

    # ------------------------------------------------------------------------------------ derived values
    @property
    def op(self) -> str:
        """The registry key: "conv2d_fwd", "conv2d_bwd_data" or "conv2d_bwd_filter"."""
        return f"conv2d_{self.direction}"

    @property
    def flops(self) -> int:
        """The direct convolution's operation count, 2 * N * K * P * Q * (C/G) * R * S, padding included
        (the same for all three directions)."""
        return 2 * self.mb * self.oc * self.oh * self.ow * (self.ic // self.g) * self.kh * self.kw

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8

    @property
    def stride(self) -> tuple[int, int]:
        return (self.sh, self.sw)

    @property
    def padding(self) -> tuple[int, int]:
        return (self.ph, self.pw)

    @property
    def dilation(self) -> tuple[int, int]:
        """torch's (1-based) dilation: (dh + 1, dw + 1)."""
        return (self.dh + 1, self.dw + 1)

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.mb, self.ic, self.ih, self.iw)  # N, C, H, W

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.oc, self.ic // self.g, self.kh, self.kw)  # K, C/G, R, S

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.mb, self.oc, self.oh, self.ow)  # N, K, P, Q

    # -------------------------------------------------------------------------------------- descriptor
    def descriptor(self, canonical: bool = True) -> str:
        """The benchdnn descriptor. canonical (the default, and str()): every field, in benchdnn's order,
        e.g. g1mb8ic64ih56iw56oc64oh56ow56kh3kw3sh1sw1ph1pw1dh0dw0n"name" -- one spelling per problem,
        fit for cache keys. canonical=False: benchdnn's short form, leaving out g1, mb2, stride 1,
        dilation 0 and the w fields when they equal the h ones. Both parse back to an equal problem
        (given the same direction, dtype, bias and device)."""
        v = {f: getattr(self, f) for f in _CONV_INTS}
        if canonical:
            s = "".join(f"{f}{v[f]}" for f in _CONV_INTS)
        else:
            square = all(v[c + "h"] == v[c + "w"] for c in _SPATIAL)

            def spatial(c):
                return f"{c}h{v[c + 'h']}" + ("" if square else f"{c}w{v[c + 'w']}")

            s = "" if v["g"] == 1 else f"g{v['g']}"
            s += "" if v["mb"] == 2 else f"mb{v['mb']}"
            s += f"ic{v['ic']}" + spatial("i") + f"oc{v['oc']}" + spatial("o") + spatial("k")
            s += "" if (v["sh"], v["sw"]) == (1, 1) else spatial("s")
            s += spatial("p")
            s += "" if (v["dh"], v["dw"]) == (0, 0) else spatial("d")
        if self.name:
            s += f'n"{self.name}"'
        return s

    __str__ = descriptor

    @classmethod
    def parse(cls, text: str, *, direction: str = "fwd", dtype: str = "float32", bias: bool = False,
              device: str = "cpu") -> "ConvProblem":
        """A ConvProblem from a benchdnn convolution descriptor, following benchdnn's rules
        (tests/benchdnn/conv/conv_aux.cpp str2desc and sanitize_desc in oneDNN):

        - entries g, mb, ic, ih, iw, oc, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw are a name and a number,
          in any order; '_' between them is ignored; n<name> ends the descriptor and takes the rest of
          the text as the name (one pair of enclosing double quotes is removed; a name may not contain
          any other, so a '#' inside a quoted name is never a comment in a workload file);
        - left out: g = 1, mb = 2, sh = sw = 1, dh = dw = 0; ic, oc, ih and kh (or iw and kw) must be given;
        - a missing output size is computed, oh = (ih + 2*ph - ((kh-1)*(dh+1)+1)) // sh + 1, with ph = 0
          when it is missing too; an output that computes to <= 0 is an error;
        - a missing padding with a given output size is ((oh-1)*sh - ih + (kh-1)*(dh+1) + 1) / 2, rounded
          toward zero as benchdnn's C does (ih56oh28kh1sh2 gives ph = 0);
        - oh0, ih0, kh0 (or dh0, sh1, ph0) mean "not given", as in benchdnn;
        - a w dimension with none of iw, kw, ow, dw given (and sw, pw trivial) takes all six values of the
          h dimension: "square form". Conversely a descriptor with only w entries is a 1-D convolution:
          the h dimension is ih = kh = oh = sh = 1, ph = dh = 0.

        Where benchdnn is silent or lenient this parser is strict: a repeated entry, depth entries
        (id, od, kd, sd, pd, dd: a 3-D convolution) and an explicit trivial w entry (sw1, pw0, dw0) that
        contradicts the h value a square form copies (benchdnn silently overwrites it) are errors, and an
        oh that needs a different padding on each side is rejected (see the class docstring).
        Errors are ValueErrors naming ConvProblem.parse and the text.
        """
        if not isinstance(text, str):
            raise TypeError(f"ConvProblem.parse: expected a str, got {type(text).__name__}")
        src = text.strip()

        def fail(why):
            return ValueError(f"ConvProblem.parse: cannot parse {text!r}: {why}")

        given: dict[str, int] = {}
        name = ""
        pos = 0
        while pos < len(src):
            if src[pos] == "_":
                pos += 1
                continue
            if src[pos] == "n":
                name = src[pos + 1:]
                if len(name) >= 2 and name[0] == name[-1] == '"':
                    name = name[1:-1]
                break
            m = _CONV_TOKEN.match(src, pos)
            if m is None:
                raise fail(f"unrecognized entry at {src[pos:]!r}; expected entries such as g1, mb8, ic64, ih56, "
                           f"iw56, oc64, oh56, ow56, kh3, kw3, sh1, sw1, ph1, pw1, dh0, dw0 and n\"name\"")
            key, val = m.group(1), int(m.group(2))
            if key in given:
                raise fail(f"{key} is given twice")
            given[key] = val
            pos = m.end()
        if not given:
            raise fail("no entries")
        depth = [f for f in _DEPTH_FIELDS if f in given]
        if depth:
            raise fail(f"depth entries {depth} describe a 3-D convolution; only 2-D is supported")
        if given.get("g", 1) < 1:
            raise fail("g must be >= 1")
        for f in ("ic", "oc"):
            if given.get(f, 0) < 1:
                raise fail(f"{f} must be given and > 0")

        dims: dict[str, dict | None] = {}
        for x in "hw":
            i, k, o, d = (given.get(c + x, 0) for c in "ikod")
            s, p = given.get("s" + x, 1), given.get("p" + x)  # p None: not given
            if s < 1:
                raise fail(f"s{x} must be >= 1")
            if i == 0 and k == 0 and o == 0 and d == 0 and s == 1 and not p:
                dims[x] = None  # the whole dimension is left out
                continue
            for c in "ik":
                if given.get(c + x, 0) == 0:
                    raise fail(f"{c}{x} must be given and > 0 when the {x} dimension is described")
            if o == 0:
                p = 0 if p is None else p
                o = conv_output_size(i, k, s, p, d)
                if o < 1:
                    raise fail(f"o{x} computes to {o} <= 0: the kernel's extent (k{x}-1)*(d{x}+1)+1 = "
                               f"{(k - 1) * (d + 1) + 1} exceeds i{x} + 2*p{x} = {i + 2 * p}")
            elif p is None:
                p = _trunc_div((o - 1) * s - i + (k - 1) * (d + 1) + 1, 2)
            dims[x] = {"o": o, "i": i, "k": k, "s": s, "p": p, "d": d}
        if dims["h"] is None and dims["w"] is None:
            raise fail("no spatial entries; give at least ih and kh")
        for x, y in (("w", "h"), ("h", "w")):
            if dims[x] is None:
                # Square form (w from h), or a 1-D problem (h absent): benchdnn fills the whole dimension.
                dims[x] = dict(dims[y]) if x == "w" else dict(_ABSENT_DIM)
                for c in "spd":  # trivial entries given explicitly must agree with what is filled in
                    if c + x in given and given[c + x] != dims[x][c]:
                        raise fail(f"{c}{x}{given[c + x]} contradicts the {c}{x}={dims[x][c]} this form implies; "
                                   f"give i{x} and k{x} to describe the {x} dimension")
        fields = {c + x: dims[x][c] for x in "hw" for c in _SPATIAL}
        try:
            return cls(g=given.get("g", 1), mb=given.get("mb", 2), ic=given["ic"], oc=given["oc"], **fields,
                       name=name, direction=direction, dtype=dtype, bias=bias, device=device)
        except ValueError as e:
            raise ValueError(f"ConvProblem.parse: invalid problem {text!r}: {e}") from None

    # --------------------------------------------------------------------------------- from arguments
    @classmethod
    def from_arrays(cls, x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1, *, direction="fwd",
                    dtype="float32", bias=False, device="cpu", name="", op="conv2d") -> "ConvProblem":
        """The problem of a torch-style call: x_shape (N, C, H, W), w_shape (K, C/groups, R, S), stride and
        dilation (1-based) an int or a pair, padding an int, a pair, "valid" (0) or "same".

        "same" follows torch: stride must be 1, and the total padding along a dimension is
        dilation * (kernel - 1). When that is odd torch pads one more on the right/bottom than on the
        left/top; a ConvProblem has one padding for both sides, so that case is a ValueError ("asymmetric
        'same' padding is not supported"). The array API (conv2d and its backward functions) takes it: it
        pads the one extra row or column itself and runs the symmetric problem.

        Errors are ValueError (bad values) or TypeError (bad types) whose messages start with op.
        """
        if not isinstance(op, str):
            raise TypeError(f"ConvProblem.from_arrays: op must be a str, got {type(op).__name__}")
        n, c, h, w = _conv_shape(op, "input", x_shape, "(N, C, H, W)")
        k, cg, r, s = _conv_shape(op, "weight", w_shape, "(out_channels, in_channels/groups, kH, kW)")
        if isinstance(groups, bool) or not isinstance(groups, numbers.Integral):
            raise TypeError(f"{op}: groups must be an int, got {shown(groups, typed=True)}")
        groups = int(groups)
        if groups < 1:
            raise ValueError(f"{op}: groups must be >= 1, got {groups}")
        sh, sw = _conv_pair(op, "stride", stride, 1)
        dh, dw = _conv_pair(op, "dilation", dilation, 1)
        if c < 1:
            raise ValueError(f"{op}: input must have at least one channel, got shape {tuple(x_shape)}")
        if c % groups:
            raise ValueError(f"{op}: groups must divide in_channels, got in_channels={c}, groups={groups}")
        if k % groups:
            raise ValueError(f"{op}: groups must divide out_channels, got out_channels={k} (weight shape "
                             f"{tuple(w_shape)}), groups={groups}")
        if cg * groups != c:
            raise ValueError(f"{op}: weight has {cg} input channels per group but input has {c} channels with "
                             f"groups={groups} (expected weight.shape[1] == {c // groups})")
        for arg, dim, v in (("input", "height", h), ("input", "width", w), ("weight", "out_channels", k),
                            ("weight", "kernel height", r), ("weight", "kernel width", s)):
            if v < 1:
                raise ValueError(f"{op}: {arg} {dim} must be >= 1, got {v}")
        if isinstance(padding, str):
            if padding == "valid":
                ph = pw = 0
            elif padding == "same":
                if (sh, sw) != (1, 1):
                    raise ValueError(f"{op}: padding='same' needs stride 1 (as in torch), got stride {(sh, sw)}")
                total = (dh * (r - 1), dw * (s - 1))
                if total[0] % 2 or total[1] % 2:
                    raise ValueError(
                        f"{op}: asymmetric 'same' padding is not supported: dilation * (kernel - 1) = {total} "
                        f"is odd, so torch would pad one more on the bottom/right than on the top/left"
                    )
                ph, pw = total[0] // 2, total[1] // 2
            else:
                raise ValueError(
                    f"{op}: padding must be an int, a pair of ints, 'same' or 'valid', got {shown(padding)}")
        else:
            ph, pw = _conv_pair(op, "padding", padding, 0, strings=True)
        for dim, i, kk, p, d in (("height", h, r, ph, dh), ("width", w, s, pw, dw)):
            extent = d * (kk - 1) + 1
            if extent > i + 2 * p:
                raise ValueError(
                    f"{op}: the output would be empty: the kernel spans {extent} (kernel {kk}, dilation {d}) "
                    f"but the input {dim} with padding is {i} + 2*{p} = {i + 2 * p}"
                )
        if not isinstance(dtype, str):
            import numpy as np  # only for dtype objects (np.float32, np.dtype("float64"))

            try:
                dtype = np.dtype(dtype).name
            except TypeError:
                raise TypeError(f"{op}: dtype must be float32 or float64, got {shown(dtype)}") from None
        try:
            return cls(g=groups, mb=n, ic=c, ih=h, iw=w, oc=k, oh=conv_output_size(h, r, sh, ph, dh - 1),
                       ow=conv_output_size(w, s, sw, pw, dw - 1), kh=r, kw=s, sh=sh, sw=sw, ph=ph, pw=pw,
                       dh=dh - 1, dw=dw - 1, name=name, direction=direction, dtype=dtype, bias=bias, device=device)
        except ValueError as e:
            raise ValueError(f"{op}: {e}") from None


def _conv_shape(op: str, arg: str, shape, layout: str) -> tuple[int, int, int, int]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or not hasattr(shape, "__iter__"):
        raise TypeError(f"{op}: {arg} shape must be a sequence of ints, got {type(shape).__name__}")
    dims = tuple(shape)
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in dims):
        raise TypeError(f"{op}: {arg} shape must be a sequence of ints, got {shown(dims)}")
    if len(dims) != 4:
        raise ValueError(f"{op}: {arg} must be 4-D {layout}, got shape {shown(dims)}")
    if any(v < 0 for v in dims):
        raise ValueError(f"{op}: {arg} shape must not be negative, got {dims}")
    return tuple(int(v) for v in dims)


def _conv_pair(op: str, arg: str, v, lo: int, strings: bool = False) -> tuple[int, int]:
    """An int or a pair of ints (tuple or list; one int in one stands for both, as torch takes it), each >= lo,
    as a pair."""
    what = "an int, a pair of ints, 'same' or 'valid'" if strings else "an int or a pair of ints"
    if isinstance(v, (tuple, list)) and len(v) == 1:
        v = v[0] if isinstance(v[0], numbers.Integral) and not isinstance(v[0], bool) else v
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        pair = (int(v), int(v))
    elif isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{op}: {arg} must be {what}, got {shown(v)}")
        if any(isinstance(e, bool) or not isinstance(e, numbers.Integral) for e in v):
            raise TypeError(f"{op}: {arg} must be {what}, got {shown(v)}")
        pair = (int(v[0]), int(v[1]))
    else:
        raise TypeError(f"{op}: {arg} must be {what}, got {shown(v, typed=True)}")
    if min(pair) < lo:
        raise ValueError(f"{op}: {arg} must be >= {lo}, got {v!r}")
    if max(pair) > MAX_SIZE:
        raise ValueError(f"{op}: {arg} must be at most {MAX_SIZE}, got {v!r}")
    return pair


def _strip_comment(line: str) -> str:
    """line up to a '#' that is not inside a double-quoted name."""
    quoted = False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted:
            return line[:i]
    return line


def load_problems(path_or_text, *, direction: str = "fwd", dtype: str = "float32", bias: bool = False,
                  device: str = "cpu") -> list[ConvProblem]:
    """The convolution problems of a workload file, or of its text: one benchdnn descriptor a line;
    blank lines and '#' comments (outside a quoted name) are skipped. path_or_text: a path (str or
    os.PathLike) of an existing file, or else the text itself. The keyword arguments go to
    ConvProblem.parse for every line. A bad line is a ValueError naming its line number."""
    if isinstance(path_or_text, os.PathLike) or (
        isinstance(path_or_text, str) and "\n" not in path_or_text and os.path.isfile(path_or_text)
    ):
        source = os.fspath(path_or_text)
        text = Path(source).read_text(encoding="utf-8")
    elif isinstance(path_or_text, str):
        source, text = "<text>", path_or_text
    else:
        raise TypeError(f"load_problems: expected a path or the text of a problem file, got "
                        f"{type(path_or_text).__name__}")
    problems = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = _strip_comment(line).strip()
        if not line:
            continue
        try:
            problems.append(ConvProblem.parse(line, direction=direction, dtype=dtype, bias=bias, device=device))
        except ValueError as e:
            hint = " (and no file of that name exists)" if source == "<text>" and "\n" not in text else ""
            raise ValueError(f"load_problems: {source}, line {lineno}: {e}{hint}") from None
    return problems


def parse_descriptor(text: str, *, direction: str = "fwd", dtype: str = "float32", bias: bool = False,
                     device: str = "cpu"):
    """A GemmProblem, RnnProblem or ConvProblem from its descriptor: the GEMM and RNN grammars (strict)
    are tried first, then benchdnn's convolution grammar, which takes the keyword arguments."""
    # A GEMM or RNN descriptor's own _f32/_f64 wins; without one, the dtype asked for.
    if text.strip().startswith(RNN_MODES):
        r = RnnProblem.parse(text, direction="bwd" if direction.startswith("bwd") else "fwd")
        return r if re.search(r"_f(32|64)(_cpu|_cuda)?$", text.strip()) else dataclasses.replace(r, dtype=dtype)
    try:
        g = GemmProblem.parse(text)
    except ValueError as gemm_error:
        try:
            return ConvProblem.parse(text, direction=direction, dtype=dtype, bias=bias, device=device)
        except ValueError as conv_error:
            raise ValueError(f"{text.strip()!r} is neither a GEMM descriptor ({gemm_error}) nor a convolution "
                             f"descriptor ({conv_error})") from None
    return g if text.strip().endswith(("_f32", "_f64")) else dataclasses.replace(g, dtype=dtype)


# ------------------------------------------------------------------------------------------------- RNN
RNN_MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
RNN_DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class RnnProblem:
    """A fused RNN over a sequence (a cell is seq = 1, one layer, one direction): torch.nn.LSTM's shapes.

    mode: lstm, gru, rnn_tanh or rnn_relu; seq T, batch B, input I (the first layer's features), hidden H,
    layers L, dirs D (2: bidirectional); direction "fwd" (forward) or "bwd" (backward through time);
    proj P: an LSTM's projection size (torch.nn.LSTM's proj_size; 0: none), written dic<P> in the
    descriptor (benchdnn's name for the size of h).
    """

    mode: str
    seq: int
    batch: int
    input: int
    hidden: int
    layers: int = 1
    dirs: int = 1
    bias: bool = True
    direction: str = "fwd"
    dtype: str = "float32"
    device: str = "cpu"
    proj: int = 0

    def __post_init__(self):
        if self.mode not in RNN_MODES:
            raise ValueError(f"RnnProblem: mode must be one of {RNN_MODES}, got {self.mode!r}")
        for name, lo in (("seq", 1), ("batch", 0), ("input", 1), ("hidden", 1), ("layers", 1), ("dirs", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"RnnProblem: {name} must be an int >= {lo}, got {v!r}")
            if v > MAX_SIZE:
                raise ValueError(f"RnnProblem: {name} must be at most {MAX_SIZE}, got {v}")
        if self.dirs > 2:
            raise ValueError(f"RnnProblem: dirs must be 1 or 2, got {self.dirs}")
        if self.layers > MAX_RNN_LAYERS:
            raise ValueError(f"RnnProblem: layers must be at most {MAX_RNN_LAYERS}, got {self.layers}")
        if isinstance(self.proj, bool) or not isinstance(self.proj, int) or self.proj < 0:
            raise ValueError(f"RnnProblem: proj must be an int >= 0, got {self.proj!r}")
        if self.proj and (self.mode != "lstm" or self.proj >= self.hidden):
            raise ValueError(f"RnnProblem: proj needs mode 'lstm' and proj < hidden, got mode {self.mode!r}, "
                             f"proj {self.proj}, hidden {self.hidden}")
        if self.direction not in RNN_DIRECTIONS:
            raise ValueError(f"RnnProblem: direction must be one of {RNN_DIRECTIONS}, got {self.direction!r}")
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"RnnProblem: dtype must be one of {tuple(DTYPE_CODES)}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"RnnProblem: device must be one of {DEVICES}, got {self.device!r}")

    @property
    def op(self) -> str:
        return f"{self.mode}_{self.direction}"

    @property
    def gates(self) -> int:
        return RNN_GATES[self.mode]

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8

    @property
    def state(self) -> int:
        """The size of h (the recurrent state and each direction's output): proj, or hidden without one."""
        return self.proj or self.hidden

    @property
    def flops(self) -> int:
        """Multiply-adds of the GEMMs, times two: input and recurrent projections of every layer and
        direction, and the output projection (backward: the data and weight gradients, twice the forward)."""
        g, h, s = self.gates, self.hidden, self.state
        total = 0
        for layer in range(self.layers):
            inp = self.input if layer == 0 else self.dirs * s
            total += self.dirs * 2 * self.seq * self.batch * (g * h * (inp + s) + (s * h if self.proj else 0))
        return total if self.direction == "fwd" else 2 * total

    def descriptor(self) -> str:
        s = f"{self.mode}_l{self.layers}t{self.seq}mb{self.batch}slc{self.input}sic{self.hidden}"
        s += f"dic{self.proj}" if self.proj else ""
        s += "_bidir" if self.dirs == 2 else ""
        s += "" if self.bias else "_nobias"
        s += f"_{DTYPE_CODES[self.dtype]}"
        s += f"_{self.device}" if self.device != "cpu" else ""
        return s

    __str__ = descriptor

    _RE = re.compile(
        r"^(?P<mode>lstm|gru|rnn_tanh|rnn_relu)_l(?P<l>\d+)t(?P<t>\d+)mb(?P<mb>\d+)slc(?P<slc>\d+)sic(?P<sic>\d+)"
        r"(?:dic(?P<dic>\d+))?(?P<bidir>_bidir)?(?P<nobias>_nobias)?(?:_(?P<dt>f32|f64))?(?:_(?P<dev>cpu|cuda))?$"
    )

    @classmethod
    def parse(cls, text: str, *, direction: str = "fwd") -> "RnnProblem":
        match = cls._RE.match(text.strip())
        if not match:
            raise ValueError(f"RnnProblem.parse: cannot parse {text!r}; expected "
                             "<mode>_l<L>t<T>mb<B>slc<I>sic<H>[dic<P>][_bidir][_nobias][_f32|_f64]")
        g = match.groupdict()
        return cls(g["mode"], int(g["t"]), int(g["mb"]), int(g["slc"]), int(g["sic"]), layers=int(g["l"]),
                   dirs=2 if g["bidir"] else 1, bias=not g["nobias"], direction=direction,
                   dtype=DTYPES[g["dt"] or "f32"], device=g["dev"] or "cpu", proj=int(g["dic"] or 0))
