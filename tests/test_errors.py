"""Bad input gets a TypeError or ValueError naming the operator and the argument, never a crash; sizes
that cannot be allocated raise MemoryError at once. Also the settings, explain() and problem descriptors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnkit
from dnnkit.problem import ACTIVATIONS, MAX_SIZE, GemmProblem, RnnProblem, parse_descriptor

F32 = np.float32
A = np.ones((3, 4), F32)
B = np.ones((4, 5), F32)
C = np.zeros((3, 5), F32)


def _readonly(x):
    x = x.copy()
    x.flags.writeable = False
    return x


def _ragged():
    return [[1.0, 2.0], [3.0]]


# (id, call, expected exception, regex the message must match: operator and argument)
GEMM_CASES = [
    ("a_int", lambda: dnnkit.gemm(np.ones((3, 4), np.int64), B), TypeError, r"gemm: a .*float32 or float64"),
    ("b_int32", lambda: dnnkit.gemm(A, np.ones((4, 5), np.int32)), TypeError, r"gemm: b .*float32 or float64"),
    ("a_object", lambda: dnnkit.gemm(np.ones((3, 4), object), B), TypeError, r"gemm: a .*object"),
    ("a_float16", lambda: dnnkit.gemm(A.astype(np.float16), B.astype(np.float16)), TypeError, r"gemm: a .*float16"),
    ("b_bool", lambda: dnnkit.gemm(A, np.ones((4, 5), bool)), TypeError, r"gemm: b .*bool"),
    ("a_complex", lambda: dnnkit.gemm(A.astype(np.complex64), B), TypeError, r"gemm: a "),
    ("a_str", lambda: dnnkit.gemm("abc", B), TypeError, r"gemm: a "),
    ("a_ragged", lambda: dnnkit.gemm(_ragged(), B), TypeError, r"gemm: a "),
    ("mixed_dtypes", lambda: dnnkit.gemm(A, B.astype(np.float64)), TypeError, r"gemm: b .*float64.*a .*float32"),
    ("a_1d", lambda: dnnkit.gemm(np.ones(4, F32), B), ValueError, r"gemm: a must be 2-D"),
    ("b_3d", lambda: dnnkit.gemm(A, np.ones((4, 5, 1), F32)), ValueError, r"gemm: b must be 2-D"),
    ("a_0d", lambda: dnnkit.gemm(np.float32(1.0), B), ValueError, r"gemm: a must be 2-D"),
    ("inner_mismatch", lambda: dnnkit.gemm(A, np.ones((5, 5), F32)), ValueError,
     r"gemm: inner dimensions.*op\(a\) is 3x4.*op\(b\) is 5x5"),
    ("inner_mismatch_trans", lambda: dnnkit.gemm(A, B, trans_a=True), ValueError,
     r"gemm: inner dimensions.*op\(a\) is 4x3"),
    ("c_shape", lambda: dnnkit.gemm(A, B, np.zeros((5, 3), F32)), ValueError, r"gemm: c must have shape \(3, 5\)"),
    ("c_dtype", lambda: dnnkit.gemm(A, B, np.zeros((3, 5), np.float64)), TypeError, r"gemm: c must have dtype float32"),
    ("c_int", lambda: dnnkit.gemm(A, B, np.zeros((3, 5), np.int32)), TypeError, r"gemm: c must have dtype"),
    ("c_list", lambda: dnnkit.gemm(A, B, C.tolist()), TypeError, r"gemm: c must be a NumPy array"),
    ("c_readonly", lambda: dnnkit.gemm(A, B, _readonly(C)), ValueError, r"gemm: c is read-only"),
    ("c_broadcast", lambda: dnnkit.gemm(A, B, np.broadcast_to(np.zeros(5, F32), (3, 5))), ValueError, r"gemm: c "),
    ("beta_without_c", lambda: dnnkit.gemm(A, B, beta=1.0), ValueError, r"gemm: beta .*c"),
    ("trans_a_int", lambda: dnnkit.gemm(A, B, trans_a=1), TypeError, r"gemm: trans_a must be a bool"),
    ("trans_b_str", lambda: dnnkit.gemm(A, B, trans_b="no"), TypeError, r"gemm: trans_b must be a bool"),
    ("trans_b_none", lambda: dnnkit.gemm(A, B, trans_b=None), TypeError, r"gemm: trans_b must be a bool"),
    ("alpha_str", lambda: dnnkit.gemm(A, B, alpha="2"), TypeError, r"gemm: alpha must be a real number"),
    ("beta_complex", lambda: dnnkit.gemm(A, B, C, beta=1j), TypeError, r"gemm: beta must be a real number"),
    ("alpha_bool", lambda: dnnkit.gemm(A, B, alpha=True), TypeError, r"gemm: alpha"),
    ("algo_unknown", lambda: dnnkit.gemm(A, B, algo="winograd"), ValueError, r"gemm: algo .*blocked_gemm.*winograd"),
    ("algo_not_str", lambda: dnnkit.gemm(A, B, algo=3), TypeError, r"gemm: algo"),
    ("a_none", lambda: dnnkit.gemm(None, B), TypeError, r"gemm: a must be an array, got None"),
    ("b_none", lambda: dnnkit.gemm(A, None), TypeError, r"gemm: b must be an array, got None"),
]

X = np.ones((2, 4), F32)
W = np.ones((3, 4), F32)
BIAS = np.ones(3, F32)
GY = np.ones((2, 3), F32)

LINEAR_CASES = [
    ("input_int", lambda: dnnkit.linear(X.astype(np.int64), W), TypeError, r"linear: input .*float32 or float64"),
    ("weight_float16", lambda: dnnkit.linear(X, W.astype(np.float16)), TypeError, r"linear: weight .*float16"),
    ("bias_bool", lambda: dnnkit.linear(X, W, np.ones(3, bool)), TypeError, r"linear: bias .*bool"),
    ("weight_object", lambda: dnnkit.linear(X, W.astype(object)), TypeError, r"linear: weight "),
    ("mixed_dtypes", lambda: dnnkit.linear(X, W.astype(np.float64)), TypeError, r"linear: weight .*input"),
    ("bias_dtype", lambda: dnnkit.linear(X, W, BIAS.astype(np.float64)), TypeError, r"linear: bias "),
    ("input_0d", lambda: dnnkit.linear(np.float32(1.0), W), ValueError, r"linear: input .*dimension"),
    ("weight_1d", lambda: dnnkit.linear(X, np.ones(4, F32)), ValueError, r"linear: weight must be 2-D"),
    ("weight_3d", lambda: dnnkit.linear(X, np.ones((3, 4, 1), F32)), ValueError, r"linear: weight must be 2-D"),
    ("features", lambda: dnnkit.linear(X, np.ones((3, 5), F32)), ValueError, r"linear: input has 4 features.*weight"),
    ("bias_length", lambda: dnnkit.linear(X, W, np.ones(4, F32)), ValueError, r"linear: bias must have 3 elements"),
    ("bias_rank", lambda: dnnkit.linear(X, W, np.ones((1, 3), F32)), ValueError, r"linear: bias must be 1-D"),
    ("activation", lambda: dnnkit.linear(X, W, activation="swish"), ValueError, r"linear: activation .*swish"),
    ("activation_int", lambda: dnnkit.linear(X, W, activation=1), ValueError, r"linear: activation"),
    ("return_preactivation", lambda: dnnkit.linear(X, W, return_preactivation="yes"), TypeError,
     r"linear: return_preactivation must be a bool"),
    ("algo_unknown", lambda: dnnkit.linear(X, W, algo="fft"), ValueError, r"linear: algo .*fft"),
    ("input_none", lambda: dnnkit.linear(None, W), TypeError, r"linear: input must be an array, got None"),
    ("weight_none", lambda: dnnkit.linear(X, None), TypeError, r"linear: weight must be an array, got None"),
]

_Y = np.ones((2, 3), F32)
BACKWARD_CASES = [
    ("grad_output_shape", lambda: dnnkit.linear_backward(np.ones((2, 4), F32), X, W), ValueError,
     r"linear_backward: grad_output must have shape \(2, 3\)"),
    ("grad_output_dtype", lambda: dnnkit.linear_backward(GY.astype(np.float64), X, W), TypeError,
     r"linear_backward: input .*grad_output"),
    ("input_int", lambda: dnnkit.linear_backward(GY, X.astype(np.int32), W), TypeError, r"linear_backward: input "),
    ("weight_bool", lambda: dnnkit.linear_backward(GY, X, W.astype(bool)), TypeError, r"linear_backward: weight "),
    ("weight_1d", lambda: dnnkit.linear_backward(GY, X, np.ones(4, F32)), ValueError,
     r"linear_backward: weight must be 2-D"),
    ("features", lambda: dnnkit.linear_backward(GY, X, np.ones((3, 5), F32)), ValueError,
     r"linear_backward: input has 4 features"),
    ("gelu_without_preactivation", lambda: dnnkit.linear_backward(GY, X, W, activation="gelu", output=_Y),
     ValueError, r"linear_backward: .*gelu.*preactivation"),
    ("relu_without_saved", lambda: dnnkit.linear_backward(GY, X, W, activation="relu"), ValueError,
     r"linear_backward: .*relu.*output"),
    ("output_shape", lambda: dnnkit.linear_backward(GY, X, W, activation="tanh", output=np.ones((3, 2), F32)),
     ValueError, r"linear_backward: output must have shape"),
    ("preactivation_dtype", lambda: dnnkit.linear_backward(GY, X, W, activation="gelu",
                                                           preactivation=_Y.astype(np.float64)),
     TypeError, r"linear_backward: preactivation must have dtype float32"),
    ("bias_flag", lambda: dnnkit.linear_backward(GY, X, W, bias="yes"), TypeError,
     r"linear_backward: bias must be a bool"),
    ("activation", lambda: dnnkit.linear_backward(GY, X, W, activation="elu"), ValueError,
     r"linear_backward: activation"),
    ("algo_unknown", lambda: dnnkit.linear_backward(GY, X, W, algo="nope"), ValueError,
     r"linear_backward: algo .*nope"),
    ("grad_output_none", lambda: dnnkit.linear_backward(None, X, W), TypeError,
     r"linear_backward: grad_output must be an array, got None"),
    ("weight_none", lambda: dnnkit.linear_backward(GY, X, None), TypeError,
     r"linear_backward: weight must be an array, got None"),
]


def _cases(cases):
    return pytest.mark.parametrize("call, exc, message", [c[1:] for c in cases], ids=[c[0] for c in cases])


@_cases(GEMM_CASES)
def test_gemm_rejects(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


@_cases(LINEAR_CASES)
def test_linear_rejects(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


@_cases(BACKWARD_CASES)
def test_linear_backward_rejects(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_rejected_gemm_leaves_c_alone():
    c = np.full((3, 5), 7.0, F32)
    with pytest.raises(TypeError):
        dnnkit.gemm(A, B, c, trans_a="x")
    with pytest.raises(ValueError):
        dnnkit.gemm(A, B, c, algo="nope")
    assert (c == 7.0).all()


# ------------------------------------------------------------------------------------ unallocatable sizes
def _broadcast(shape, dtype=F32):
    """A huge read-only array with one element of memory (all strides 0)."""
    return np.broadcast_to(np.ones((), dtype), shape)


def test_gemm_output_too_large_raises_memory_error():
    """An output that cannot be allocated raises MemoryError before any kernel runs (no crash, no hang):
    2**20 squared float32 is 4 TiB, more than the machine has."""
    a, b = _broadcast((2**20, 1)), _broadcast((1, 2**20))
    with pytest.raises(MemoryError, match="gemm"):
        dnnkit.gemm(a, b)


def test_linear_output_too_large_raises_memory_error():
    x, w = _broadcast((2**21, 1)), _broadcast((2**21, 1))
    with pytest.raises(MemoryError, match="linear"):
        dnnkit.linear(x, w)


BIG = MAX_SIZE + 1


@pytest.mark.parametrize("call, message", [
    (lambda: dnnkit.gemm(_broadcast((BIG, 1)), B[:1]), "gemm: .*m must be at most 2147483647"),
    (lambda: dnnkit.gemm(_broadcast((2**40, 1)), _broadcast((1, 2**40))), "gemm: .*m must be at most"),
    (lambda: dnnkit.linear(_broadcast((2**16, 2**15, 4)), A), "linear: .*m must be at most"),
    (lambda: dnnkit.lstm(_broadcast((BIG, 1, 1)), None, None, [np.ones((4, 1), F32)] * 2),
     "lstm: .*seq must be at most"),
    (lambda: dnnkit.conv2d(_broadcast((1, 1, BIG, 1)), np.ones((1, 1, 1, 1), F32)), "conv2d: .*ih must be at most"),
    (lambda: dnnkit.conv2d(np.ones((1, 1, 4, 4), F32), np.ones((1, 1, 3, 3), F32), padding=2**62),
     "conv2d: padding must be at most 2147483647"),
    (lambda: dnnkit.conv2d(np.ones((1, 1, 4, 4), F32), np.ones((1, 1, 3, 3), F32), stride=(1, BIG)),
     "conv2d: stride must be at most"),
    (lambda: dnnkit.conv2d(np.ones((1, 1, 4, 4), F32), np.ones((1, 1, 1, 1), F32), dilation=2**40),
     "conv2d: dilation must be at most"),
], ids=["gemm", "gemm-overflow", "linear", "lstm", "conv2d-input", "conv2d-padding", "conv2d-stride",
        "conv2d-dilation"])
def test_a_size_over_the_largest_is_a_value_error_naming_the_operator(call, message):
    """Every size a problem holds is at most MAX_SIZE (2**31 - 1, as BLAS's int arguments): over it, a
    ValueError naming the operator and the size, before anything is allocated or run."""
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("text", ["m2147483648n1k1", "m99999999999999999999n1k1",
                                  "mb1ic1ih4oc1kh3ph2147483648", "lstm_l1t1mb1slc4611686018427387904sic4"])
def test_a_descriptor_over_the_largest_size_is_refused(text):
    with pytest.raises(ValueError, match="must be at most 2147483647"):
        parse_descriptor(text)


# ------------------------------------------------------------------------------------- settings, explain
def test_set_num_threads_rejects_bad_values():
    """1 to MAX_THREADS: a count OpenMP cannot create threads for would abort the process at the next call."""
    for n in (0, -3, 1025, 100000, 2**40):
        with pytest.raises(ValueError, match="set_num_threads: n must be between 1 and 1024"):
            dnnkit.set_num_threads(n)
    with pytest.raises(TypeError, match="set_num_threads"):
        dnnkit.set_num_threads(1.5)
    dnnkit.set_num_threads(1)
    assert dnnkit.get_num_threads() == 1


def test_set_tuning_rejects_unknown_mode():
    with pytest.raises(ValueError, match="set_tuning.*bogus"):
        dnnkit.set_tuning("bogus")
    for mode in ("heuristic", "measure", "off"):
        dnnkit.set_tuning(mode)
        assert dnnkit.get_tuning() == mode


def test_set_workspace_limit_rejects_bad_values():
    with pytest.raises(ValueError, match="set_workspace_limit"):
        dnnkit.set_workspace_limit(-1)
    with pytest.raises(ValueError, match="^set_workspace_limit: nbytes: not a byte count: 'lots'"):
        dnnkit.set_workspace_limit("lots")
    with pytest.raises(TypeError, match="^set_workspace_limit: nbytes must be an int, a byte count"):
        dnnkit.set_workspace_limit(1.5)
    try:  # a byte count as DNNKIT_WORKSPACE_LIMIT takes it
        dnnkit.set_workspace_limit("1 GiB")
        assert dnnkit.get_workspace_limit() == 1 << 30
    finally:
        dnnkit.set_workspace_limit(None)


WIDE = np.zeros((300, 300), F32)  # its repr alone is thousands of characters
X4, W4 = np.zeros((1, 2, 5, 5), F32), np.zeros((3, 2, 3, 3), F32)


@pytest.mark.parametrize("call, op, arg", [
    (lambda: dnnkit.conv2d(X4, W4, stride=WIDE), "conv2d", "stride"),
    (lambda: dnnkit.conv2d(X4, W4, padding=WIDE), "conv2d", "padding"),
    (lambda: dnnkit.conv2d(X4, W4, padding="s" * 5000), "conv2d", "padding"),
    (lambda: dnnkit.conv2d(X4, W4, dilation=list(range(5000))), "conv2d", "dilation"),
    (lambda: dnnkit.conv2d(X4, W4, groups=WIDE), "conv2d", "groups"),
    (lambda: dnnkit.conv2d_backward_filter(X4, WIDE, np.zeros((1, 3, 3, 3), F32)), "conv2d_backward_filter",
     "weight_shape"),
    (lambda: dnnkit.conv2d_backward_data(WIDE, W4, np.zeros((1, 3, 3, 3), F32)), "conv2d_backward_data",
     "input_shape"),
    (lambda: dnnkit.linear(A, B.T, activation=WIDE), "linear", "activation"),
    (lambda: dnnkit.rnn(np.zeros((2, 1, 4), F32), None, [np.zeros((4, 4), F32)] * 2, nonlinearity=WIDE), "rnn",
     "nonlinearity"),
    (lambda: dnnkit.set_tuning(WIDE), "set_tuning", "mode"),
    (lambda: dnnkit.set_nan_semantics(WIDE), "set_nan_semantics", "mode"),
])
def test_errors_quote_arrays_and_long_values_briefly(call, op, arg):
    with pytest.raises((TypeError, ValueError)) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(op + ":") and arg in msg and len(msg) < 300, msg


def test_set_isa_rejects_unknown_isa():
    with pytest.raises(ValueError, match="isa"):
        dnnkit._cpu.set_isa("sse9")


def test_registry_has_blocked_gemm():
    names = [a.name for a in dnnkit.algos.algorithms("gemm", "cpu")]
    assert "blocked_gemm" in names
    assert dnnkit.algos.algorithms("no_such_op", "cpu") == []


def test_explain_lists_blocked_gemm():
    ex = dnnkit.explain("m64n64k64_f32")
    by_name = {c.algorithm: c for c in ex}
    assert "blocked_gemm" in by_name
    assert by_name["blocked_gemm"].supported and by_name["blocked_gemm"].reason is None
    assert sum(c.chosen for c in ex) == 1
    assert by_name["blocked_gemm"].workspace_bytes > 0
    assert "blocked_gemm" in str(ex) and "m64n64k64_f32" in str(ex)
    # The same problem from a call's arguments and from a GemmProblem.
    from_call = dnnkit.explain("gemm", np.ones((64, 64), F32), np.ones((64, 64), F32))
    assert from_call.problem == ex.problem == dnnkit.explain(GemmProblem(64, 64, 64)).problem


def test_explain_gives_the_workspace_reason():
    ex = dnnkit.explain("m64n64k64_f32", workspace_limit=16)
    (cand,) = [c for c in ex if c.algorithm == "blocked_gemm"]
    assert not cand.supported and not cand.chosen
    assert "workspace" in cand.reason and "16" in cand.reason
    assert "blocked_gemm" in str(ex) and "workspace" in str(ex)


def test_workspace_limit_excludes_algorithms_with_a_reason():
    dnnkit.set_workspace_limit(16)  # restored by the autouse fixture
    (cand,) = [c for c in dnnkit.explain("m64n64k64_f32") if c.algorithm == "blocked_gemm"]
    assert not cand.supported and "workspace" in cand.reason
    with pytest.raises(ValueError, match=r"gemm: .*blocked_gemm.*workspace"):
        dnnkit.gemm(np.ones((64, 64), F32), np.ones((64, 64), F32))
    dnnkit.set_workspace_limit(None)
    assert dnnkit.gemm(np.ones((64, 64), F32), np.ones((64, 64), F32))[0, 0] == 64.0


def test_explain_rejects_bad_arguments():
    with pytest.raises(TypeError, match="explain"):
        dnnkit.explain(42)
    with pytest.raises(ValueError, match="GemmProblem.parse"):
        dnnkit.explain("m8n8")
    a = np.ones((4, 4), np.float32)
    with pytest.raises(TypeError, match=r"explain: gemm\(\): got an unexpected keyword argument 'bogus'"):
        dnnkit.explain("gemm", a, a, bogus=1)
    with pytest.raises(ValueError, match=r"explain: algo must be 'auto' or one of \[.*'blocked_gemm'.*got 'nope'"):
        dnnkit.explain("m4n4k4", algo="nope")
    with pytest.raises(TypeError, match="explain: algo must be"):
        dnnkit.explain("m4n4k4", algo=3)
    for limit, exc, message in (("lots", ValueError, "not a byte count"), (-1, ValueError, "must be >= 0"),
                                (True, TypeError, "must be an int, a byte count such as '64M', or None")):
        with pytest.raises(exc, match=f"^explain: workspace_limit.*{message}"):
            dnnkit.explain("m4n4k4", workspace_limit=limit)
    assert dnnkit.explain("m64n64k64", workspace_limit="1K") == dnnkit.explain("m64n64k64", workspace_limit=1024)
    with pytest.raises(ValueError, match="explain: GemmProblem: dtype must be one of"):
        dnnkit.explain("m4n4k4", dtype="float16")


def test_explain_descriptors_and_names():
    """A descriptor's keywords apply as its kind has them; an operator name explain does not take, a
    descriptor with a call's arguments, a Problem with keywords: each one clear error."""
    assert dnnkit.explain("m4n4k4", dtype="float64").problem.dtype == "float64"
    assert dnnkit.explain("m4n4k4_f32", dtype="float64").problem.dtype == "float32"  # its own suffix wins
    assert dnnkit.explain("lstm_l1t5mb2slc4sic4", dtype=np.float64).problem.dtype == "float64"
    assert dnnkit.explain("mb2ic4ih8oc4kh3ph1", dtype=np.float64, direction="bwd_data").problem.op == "conv2d_bwd_data"
    for what, kwargs, exc, message in [
        ("m4n4k4", {"direction": "bwd_filter"}, ValueError, "explain: 'm4n4k4' is a GEMM descriptor, which has no "
                                                            "direction; got direction='bwd_filter'"),
        ("lstm_l1t5mb2slc4sic4", {"direction": "bwd_data"}, ValueError, "is an RNN descriptor, whose direction is"),
        ("mb2ic4ih8oc4kh3ph1", {"direction": "bwd"}, ValueError,
         r"^explain: ConvProblem.parse: .*direction must be one of \('fwd', 'bwd_data', 'bwd_filter'\), got 'bwd'"),
        ("mb2ic4ih8oc4kh3ph1", {"colour": 1}, TypeError, "a descriptor takes the keywords direction, dtype, bias"),
        ("linear_backward", {}, ValueError, "^explain: no operator 'linear_backward' here; explain takes the calls"),
        ("Conv2d", {}, ValueError, "^explain: no operator 'Conv2d' here"),
        ("rnn_l1t5mb2slc4sic4", {}, ValueError, "rnn_tanh_l... or rnn_relu_l..."),
    ]:
        with pytest.raises(exc, match=message):
            dnnkit.explain(what, **kwargs)
    with pytest.raises(ValueError, match="^explain: no operator 'linear_backward' here"):
        dnnkit.explain("linear_backward", np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(TypeError, match="^explain: a Problem or a descriptor takes no call arguments"):
        dnnkit.explain("m4n4k4", np.ones((4, 4)))
    with pytest.raises(TypeError, match=r"^explain: a Problem takes no keywords but algo and workspace_limit"):
        dnnkit.explain(dnnkit.GemmProblem(4, 4, 4), dtype="float64")


def test_explain_takes_every_argument_of_the_calls():
    """Keywords of the calls that do not shape the problem are taken; workspace= limits the candidates as
    the call's does; padding='same' with an even kernel shows the problem the call runs."""
    a = np.ones((4, 4), np.float32)
    assert dnnkit.explain("gemm", a, a, stream=None).problem.m == 4
    assert dnnkit.explain("linear", a, a, activation="gelu", return_preactivation=True).problem.activation == "gelu"
    x, w = np.ones((2, 3, 9, 9), np.float32), np.ones((4, 3, 3, 3), np.float32)
    small = np.zeros(1000, np.uint8)
    e = dnnkit.explain("conv2d", x, w, padding=1, workspace=small)
    fits = [c.algorithm for c in e if c.reason is None]
    assert fits and all(c.workspace_bytes <= 1000 - 63 for c in e if c.reason is None)
    assert "direct" in fits and "im2col_gemm" not in fits
    assert dnnkit.explain("conv2d", x, w, padding=1, workspace=small, workspace_limit=0).problem == e.problem
    w2 = np.ones((4, 3, 2, 2), np.float32)
    y = dnnkit.conv2d(x, w2, padding="same")
    for e in (dnnkit.explain("conv2d", x, w2, padding="same"),
              dnnkit.explain("conv2d_backward_data", x.shape, w2, y, padding="same"),
              dnnkit.explain("conv2d_backward_filter", x, w2.shape, y, padding="same")):
        assert (e.problem.ih, e.problem.iw, e.problem.ph, e.problem.oh) == (10, 10, 0, 9)
    assert dnnkit.explain("conv2d", x[0], w, padding=1).problem.mb == 1  # unbatched
    with pytest.raises(TypeError, match="^conv2d: workspace must be a NumPy array"):
        dnnkit.explain("conv2d", x, w, workspace=[1, 2])


def test_an_algorithm_object_of_another_operator_is_refused():
    from dnnkit import algos

    a = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="gemm: algo 'direct' is a cpu conv2d_fwd algorithm"):
        dnnkit.gemm(a, a, algo=algos.get("conv2d_fwd", "cpu", "direct"))


# -------------------------------------------------------------------------------------- GemmProblem
problems = st.builds(
    GemmProblem,
    m=st.integers(0, 10**6), n=st.integers(0, 10**6), k=st.integers(0, 10**6), trans_a=st.booleans(),
    trans_b=st.booleans(), dtype=st.sampled_from(["float32", "float64"]), bias=st.booleans(),
    activation=st.sampled_from(ACTIVATIONS), device=st.sampled_from(["cpu", "cuda"]),
)


@given(p=problems)
def test_problem_descriptor_round_trip(p):
    text = str(p)
    assert "\n" not in text and " " not in text
    q = GemmProblem.parse(text)
    assert q == p and hash(q) == hash(p)


@given(text=st.text(max_size=40))
def test_problem_parse_never_crashes(text):
    """Any text either parses to a problem that round-trips, or raises ValueError."""
    try:
        p = GemmProblem.parse(text)
    except ValueError as e:
        assert "GemmProblem" in str(e)
    else:
        assert GemmProblem.parse(str(p)) == p


@pytest.mark.parametrize("text", [
    "", "garbage", "m8n8", "m8n8k", "mxn8k8", "m-1n8k8", "m8n8k8_f16", "m8n8k8_f32_tpu", "m8n8k8tbta",
    "m8n8k8_swish_f32", "m8n8k8 _f32", "M8N8K8", "m8n8k8_f32_f32", "m8n8k8_bias_bias",
])
def test_problem_parse_rejects_garbage(text):
    with pytest.raises(ValueError, match="GemmProblem.parse"):
        GemmProblem.parse(text)


def test_problem_rejects_bad_fields():
    for kwargs in (dict(m=-1, n=1, k=1), dict(m=1.5, n=1, k=1), dict(m=True, n=1, k=1),
                   dict(m=1, n=1, k=1, dtype="float16"), dict(m=1, n=1, k=1, activation="swish"),
                   dict(m=1, n=1, k=1, device="tpu")):
        with pytest.raises(ValueError, match="GemmProblem"):
            GemmProblem(**kwargs)


def test_problem_descriptor_defaults():
    p = GemmProblem.parse("m64n4096k4096tb_bias_relu_f32")
    assert p == GemmProblem(64, 4096, 4096, trans_b=True, bias=True, activation="relu")
    assert GemmProblem.parse("m1n2k3") == GemmProblem(1, 2, 3)
    assert str(GemmProblem(1, 2, 3, dtype="float64", device="cuda")) == "m1n2k3_f64_cuda"


def test_rnn_layers_are_bounded():
    """The cost formulas visit each layer: a descriptor of 10^8 layers is refused, not evaluated."""
    with pytest.raises(ValueError, match="RnnProblem: layers must be at most 65536"):
        dnnkit.explain("lstm_l100000000t1mb1slc1sic1")
    assert RnnProblem("lstm", 1, 1, 1, 1, layers=65536).layers == 65536
