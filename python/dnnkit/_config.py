"""Process-wide settings: threads, tuning mode, workspace limit, AMX tiles. Environment variables are read
once, at import: DNNKIT_NUM_THREADS, DNNKIT_TUNING, DNNKIT_WORKSPACE_LIMIT (bytes: 1048576, 64K, 64M, 2G),
DNNKIT_NAN_SEMANTICS, DNNKIT_ALLOW_TF32, DNNKIT_AMX (0, off, false or no: off; 1, on, true or yes: on where
the CPU has AMX), DNNKIT_ALGO_<OP> (algo_overrides) and DNNKIT_BLOCK_CACHE_MB (a whole number of MiB; the
extension reads it, it is checked here). A value that does not parse, or a DNNKIT_ALGO_ variable naming no
operator, is ignored with a warning naming the variable, and the default stands: a typo in the environment
never keeps `import dnnkit` from working."""
from __future__ import annotations

import math
import numbers
import os
import re
import warnings

from .backends import cpu as _cpu

TUNING_MODES = ("heuristic", "measure", "off")
NAN_SEMANTICS = ("any", "strict")


def _default_threads() -> int:
    """The CPUs this process may run on, at most MAX_THREADS."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, _cpu.MAX_THREADS))


def parse_bytes(text: str) -> int:
    """'1048576', '64K', '64M', '2G', '1.5GiB' (binary units) -> bytes; ValueError otherwise."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        value = float(digits)
    except ValueError:
        raise ValueError(f"not a byte count: {text!r} (e.g. 1048576, 64M, 2G)") from None
    if value < 0 or not math.isfinite(value):
        raise ValueError(f"a byte count must be >= 0, got {text!r}")
    return int(value * scale)


def _env(name: str, parse):
    """parse(value) of the environment variable, or None where it is unset, empty or does not parse
    (then with a warning that names it)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return parse(raw.strip())
    except ValueError as e:
        warnings.warn(f"dnnkit: ignoring {name}={raw!r} ({e}); using the default", RuntimeWarning, stacklevel=3)
        return None


def _thread_count(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("not an integer") from None
    if value < 1 or value > _cpu.MAX_THREADS:
        raise ValueError(f"must be between 1 and {_cpu.MAX_THREADS}")
    return value


def _tuning_mode(raw: str) -> str:
    if raw not in TUNING_MODES:
        raise ValueError(f"must be one of {TUNING_MODES}")
    return raw


def set_num_threads(n: int) -> None:
    """Number of CPU threads every dnnkit kernel uses (default: the cores this process may run on), 1 to
    MAX_THREADS (1024)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    if n < 1 or n > _cpu.MAX_THREADS:
        raise ValueError(f"set_num_threads: n must be between 1 and {_cpu.MAX_THREADS}, got {n}")
    _cpu.set_num_threads(n)


def get_num_threads() -> int:
    return _cpu.get_num_threads()


def empty_cache() -> int:
    """Frees the scratch blocks (128 KiB and up) that kernels keep for their next call, and returns the
    bytes released. At most DNNKIT_BLOCK_CACHE_MB (default 256; 0 keeps none) are kept."""
    return _cpu.block_cache_release()


def set_amx(enabled: bool) -> None:
    """Whether float32 products run on AMX tiles where the CPU has them (Intel Sapphire Rapids and later):
    each operand split into three bfloat16 parts, six part products summed in float32, for float32's
    accuracy at up to 1.5x the speed of the FMA kernels (see the README). On by default where available
    (DNNKIT_AMX=0 turns it off); set_amx(True) on a CPU without AMX raises ValueError."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_amx: enabled must be a bool, got {type(enabled).__name__}")
    _cpu.set_amx(enabled)


def get_amx() -> bool:
    """Whether float32 products run on AMX tiles where they can (set_amx)."""
    return _cpu.amx_enabled()


_state = {"tuning": "heuristic", "workspace_limit": None, "nan_semantics": "any", "algo": {}, "allow_tf32": False}

# A count bumped by every Python-side change a remembered dispatch decision depends on: the settings
# below, the registry (algos.register, unregister) and the tuning cache's writes. dispatch_state() pairs
# it with the extension's count (threads, ISA, AMX).
_generation = [0]


def generation() -> int:
    return _generation[0]


def changed() -> None:
    """Every remembered dispatch decision is stale from now on."""
    _generation[0] += 1


def _quoted(mode) -> str:
    return repr(mode) if isinstance(mode, str) and len(mode) <= 80 else type(mode).__name__


def set_tuning(mode: str) -> None:
    """What dispatch does for a problem with no explicit algo: see DESIGN.md. 'off' takes the first
    supporting algorithm of the registry."""
    if not isinstance(mode, str) or mode not in TUNING_MODES:
        raise ValueError(f"set_tuning: mode must be one of {TUNING_MODES}, got {_quoted(mode)}")
    _state["tuning"] = mode
    changed()


def get_tuning() -> str:
    return _state["tuning"]


def set_workspace_limit(nbytes: int | str | None) -> None:
    """Algorithms whose workspace_bytes() exceeds this are not chosen (None: no limit). nbytes: an int, or
    a byte count as DNNKIT_WORKSPACE_LIMIT takes it ('64M', '2G')."""
    nbytes = workspace_bytes("set_workspace_limit", "nbytes", nbytes)
    _state["workspace_limit"] = nbytes
    changed()


def workspace_bytes(op: str, name: str, nbytes):
    """A workspace limit as given (an int >= 0, a byte count such as '64M', or None) in bytes, or None; a
    TypeError/ValueError naming op and name."""
    if isinstance(nbytes, str):
        try:
            return parse_bytes(nbytes)
        except ValueError as e:
            raise ValueError(f"{op}: {name}: {e}") from None
    if nbytes is None:
        return None
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise TypeError(f"{op}: {name} must be an int, a byte count such as '64M', or None, got "
                        f"{type(nbytes).__name__}")
    if nbytes < 0:
        raise ValueError(f"{op}: {name} must be >= 0, got {nbytes}")
    return int(nbytes)


def get_workspace_limit() -> int | None:
    return _state["workspace_limit"]


def set_nan_semantics(mode: str) -> None:
    """'strict': only algorithms that propagate NaN and Inf as the reference does (Algorithm.nonfinite
    "exact"; explain() shows each one's) are chosen, and tuning checks it on planted NaN and Inf inputs;
    Winograd (a NaN or Inf spreads over its transform tiles, Inf turns NaN) and FFT (one spreads over its
    image) are then left out. 'any' (default): every algorithm within its accuracy tolerance on finite
    inputs. Also DNNKIT_NAN_SEMANTICS."""
    if not isinstance(mode, str) or mode not in NAN_SEMANTICS:
        raise ValueError(f"set_nan_semantics: mode must be one of {NAN_SEMANTICS}, got {_quoted(mode)}")
    _state["nan_semantics"] = mode
    changed()


def get_nan_semantics() -> str:
    return _state["nan_semantics"]


def _nan_semantics(raw: str) -> str:
    if raw not in NAN_SEMANTICS:
        raise ValueError(f"must be one of {NAN_SEMANTICS}")
    return raw


def set_allow_tf32(allowed: bool) -> None:
    """Whether dispatch may choose a GPU algorithm that rounds float32 operands to TF32 (10 mantissa bits)
    for the tensor cores (gemm_tf32: relative error about 1e-3 instead of 1e-6), as
    torch.backends.cuda.matmul.allow_tf32. Off by default; also DNNKIT_ALLOW_TF32=1. An explicit
    algo="gemm_tf32" runs it either way."""
    if not isinstance(allowed, bool):
        raise TypeError(f"set_allow_tf32: allowed must be a bool, got {type(allowed).__name__}")
    _state["allow_tf32"] = allowed
    changed()


def get_allow_tf32() -> bool:
    return _state["allow_tf32"]


def _bool(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return raw == "1"


def algo_overrides() -> dict:
    """{operator: algorithm name} from DNNKIT_ALGO_<OP> (DNNKIT_ALGO_CONV2D_FWD=direct,
    DNNKIT_ALGO_LSTM_FWD=fused_rows, DNNKIT_ALGO_GEMM=gemm_goto; linear layers run as gemm): what
    algo="auto" means for that operator, as an explicit algo= would (read at import: a variable naming no
    operator is ignored with a warning; a name the operator does not have is reported when the operator
    is first called)."""
    return dict(_state["algo"])


def _operators() -> tuple:
    """The operators DNNKIT_ALGO_<OP> can name: the problems' op keys."""
    from .problem import CONV_DIRECTIONS, RNN_DIRECTIONS, RNN_MODES

    return (("gemm",) + tuple(f"conv2d_{d}" for d in CONV_DIRECTIONS)
            + tuple(f"{m}_{d}" for m in RNN_MODES for d in RNN_DIRECTIONS))


def _algo_env() -> dict:
    out = {}
    ops = _operators()
    for name, value in sorted(os.environ.items()):
        if not name.startswith("DNNKIT_ALGO_") or not value.strip():
            continue
        op = name[len("DNNKIT_ALGO_"):].lower()
        if op not in ops:
            hint = "; linear layers run as gemm: DNNKIT_ALGO_GEMM" if op == "linear" else ""
            warnings.warn(f"dnnkit: ignoring {name}={value!r} (no operator {op!r}{hint}; DNNKIT_ALGO_<OP> takes "
                          f"{', '.join(o.upper() for o in ops)})", RuntimeWarning, stacklevel=3)
            continue
        out[op] = value.strip()
    return out


_OFF = ("0", "off", "false", "no")
_ON = ("1", "on", "true", "yes")


def _amx_switch(raw: str) -> bool:
    """DNNKIT_AMX: False for 0, off, false, no; True for 1, on, true, yes (any case)."""
    v = raw.strip().lower()
    if v in _OFF:
        return False
    if v in _ON:
        return True
    raise ValueError(f"must be one of {', '.join(_OFF)} (off) or {', '.join(_ON)} (on where the CPU has AMX)")


def _block_cache_mb(raw: str) -> int:
    """DNNKIT_BLOCK_CACHE_MB as the extension takes it: decimal digits only."""
    if not re.fullmatch(r"[0-9]+", raw):
        raise ValueError("must be a whole number of MiB, 0 or more")
    return int(raw)


def _init_from_env() -> None:
    if _cpu.available():
        n = _env("DNNKIT_NUM_THREADS", _thread_count)
        _cpu.set_num_threads(n if n is not None else _default_threads())
    mode = _env("DNNKIT_TUNING", _tuning_mode)
    if mode is not None:
        _state["tuning"] = mode
    _state["workspace_limit"] = _env("DNNKIT_WORKSPACE_LIMIT", parse_bytes)
    _state["nan_semantics"] = _env("DNNKIT_NAN_SEMANTICS", _nan_semantics) or "any"
    _state["allow_tf32"] = bool(_env("DNNKIT_ALLOW_TF32", _bool))
    _state["algo"] = _algo_env()
    # Read by the extension; checked here so that a value it would ignore is reported. (It reads the
    # variable unstripped: " 64" is ignored there too.)
    raw = os.environ.get("DNNKIT_BLOCK_CACHE_MB")
    if raw is not None and raw.strip():
        try:
            _block_cache_mb(raw)
        except ValueError as e:
            warnings.warn(f"dnnkit: ignoring DNNKIT_BLOCK_CACHE_MB={raw!r} ({e}); using the default",
                          RuntimeWarning, stacklevel=2)
    # The extension reads only the first character of DNNKIT_AMX ('0': off): the decision is made here
    # for every spelling, and a value that does not parse leaves the default (on where the CPU has AMX).
    amx = _env("DNNKIT_AMX", _amx_switch)
    if _cpu.available() and (os.environ.get("DNNKIT_AMX") or "").strip():
        _cpu.set_amx(amx is not False and _cpu.amx_available())


_init_from_env()
