"""ConvProblem: benchdnn descriptors (parse, print, round trip, benchdnn's rules for left-out entries),
validation, derived values, workload files, and from_arrays (torch-style arguments) with its errors."""
from __future__ import annotations

import dataclasses
import pathlib
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnnkit.problem import DATA_DIR, ConvProblem, conv_output_size, load_problems

RESNET50 = DATA_DIR / "resnet50_conv.txt"
BENCH_RESNET50 = pathlib.Path(__file__).resolve().parent.parent / "bench" / "problems" / "resnet50_conv.txt"


def conv(**fields) -> ConvProblem:
    """A ConvProblem from a few fields over a 3x3, stride-1, pad-1 base of 8x8 images."""
    base = dict(g=1, mb=2, ic=4, ih=8, iw=8, oc=6, oh=8, ow=8, kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, dh=0, dw=0)
    base.update(fields)
    return ConvProblem(**base)


# ----------------------------------------------------------------------------------------- workloads
def _descriptor_lines(path):
    return [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_resnet50_every_line_parses():
    lines = _descriptor_lines(RESNET50)
    assert len(lines) == 20
    for line in lines:
        p = ConvProblem.parse(line)
        assert p.mb == 50 and p.g == 1 and (p.dh, p.dw) == (0, 0)
        assert p.name.startswith("resnet_50:") and '"' not in p.name
        assert ConvProblem.parse(str(p)) == p
        assert ConvProblem.parse(p.descriptor(canonical=False)) == p
    assert load_problems(RESNET50) == [ConvProblem.parse(ln) for ln in lines]


def test_resnet50_values():
    by_name = {p.name: p for p in load_problems(RESNET50)}
    conv1 = by_name["resnet_50:conv1"]
    assert (conv1.ic, conv1.ih, conv1.iw, conv1.oc, conv1.oh, conv1.ow) == (3, 224, 224, 64, 112, 112)
    assert (conv1.kh, conv1.kw, conv1.stride, conv1.padding, conv1.dilation) == (7, 7, (2, 2), (3, 3), (1, 1))
    assert conv1.flops == 2 * 50 * 64 * 112 * 112 * 3 * 7 * 7
    # The '*N' (how often the layer occurs) is part of the name; the square form fills in the w entries.
    b2 = by_name["resnet_50:res2a_branch2b*3"]
    assert (b2.ic, b2.ih, b2.iw, b2.oc, b2.oh, b2.ow) == (64, 56, 56, 64, 56, 56)
    assert (b2.kh, b2.kw, b2.ph, b2.pw) == (3, 3, 1, 1)
    b1 = by_name["resnet_50:res3a_branch1"]
    assert (b1.ih, b1.oh, b1.ow, b1.kh, b1.sh, b1.sw, b1.ph) == (56, 28, 28, 1, 2, 2, 0)


def test_packaged_workload_matches_the_benchmark_copy():
    if not BENCH_RESNET50.exists():
        pytest.skip("bench/ is not beside the tests (an installed package)")
    assert RESNET50.read_text() == BENCH_RESNET50.read_text()


def test_load_problems_text_comments_and_options(tmp_path):
    text = '''# a comment
    ic3ih5oc4kh3n"first"   # a trailing comment

    g2mb1ic4ih6iw7oc2oh6ow7kh1kw1ph0pw0n"has # inside the name"
'''
    ps = load_problems(text, direction="bwd_filter", dtype="float64", bias=True)
    assert [p.name for p in ps] == ["first", "has # inside the name"]
    assert all((p.direction, p.dtype, p.bias, p.op) == ("bwd_filter", "float64", True, "conv2d_bwd_filter")
               for p in ps)
    f = tmp_path / "w.txt"
    f.write_text(text)
    assert load_problems(f, direction="bwd_filter", dtype="float64", bias=True) == ps
    assert load_problems(str(f), direction="bwd_filter", dtype="float64", bias=True) == ps
    assert load_problems("") == [] and load_problems("# nothing\n\n") == []


def test_load_problems_errors_name_the_line(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_text("ic3ih5oc4kh3\n# ok so far\nic3ih5oc4kh3zz9\n")
    with pytest.raises(ValueError, match=r"load_problems: .*bad\.txt, line 3: ConvProblem\.parse: .*zz9"):
        load_problems(f)
    with pytest.raises(ValueError, match=r"line 1: .*no file of that name"):
        load_problems("no/such/file.txt")
    with pytest.raises(TypeError, match="load_problems"):
        load_problems(42)


# -------------------------------------------------------------------------- benchdnn's omitted fields
DEFAULTS = dict(g=1, mb=2, sh=1, sw=1, dh=0, dw=0)
# (descriptor, the fields it must give); fields not listed take DEFAULTS.
OMITTED_FIELD_CASES = [
    # square form: every w entry copied from h; oh computed with ph = 0 when both are left out
    ("ic3ih5oc4kh3", dict(ic=3, ih=5, iw=5, oc=4, kh=3, kw=3, oh=3, ow=3, ph=0, pw=0)),
    ("mb8ic3ih5oc4kh3ph1", dict(mb=8, ih=5, iw=5, oh=5, ow=5, ph=1, pw=1)),
    ("ic3ih9oc4kh3sh2ph1dh1", dict(sh=2, sw=2, dh=1, dw=1, oh=4, ow=4, ph=1, pw=1)),
    # the padding computed from a given output: ((oh-1)*sh - ih + (kh-1)*(dh+1) + 1) / 2 toward zero
    ("ic64ih56oc64oh56kh3", dict(ph=1, pw=1, oh=56, ow=56)),
    ("ic64ih56oc64oh28kh1sh2", dict(ph=0, pw=0, oh=28, ow=28, sh=2, sw=2)),  # -1/2 -> 0, not -1
    ("ic3ih224oc64oh112kh7sh2ph3", dict(oh=112, ow=112, sh=2, sw=2, ph=3, pw=3)),
    # oh0 means "compute it", as in benchdnn; '_' separators are ignored; entries in any order
    ("ic3_ih5_oc4_oh0_kh3_n\"x\"", dict(oh=3, ow=3, ph=0, name="x")),
    ("kh3oc4ih5ic3mb1g1", dict(mb=1, oh=3, ow=3)),
    # explicit w dimension, and a non-square problem
    ("g2ic4ih6iw10oc8kh3kw5sw2pw2", dict(g=2, ih=6, iw=10, kh=3, kw=5, sh=1, sw=2, ph=0, pw=2, oh=4, ow=5)),
    ("ic4ih6iw7oc8kh3kw3ph1", dict(ph=1, pw=0, oh=6, ow=5)),  # ph given, pw left out: pw = 0
    # only w entries: a 1-D convolution, h set to benchdnn's defaults
    ("ic2iw9oc3kw3pw1", dict(ih=1, kh=1, oh=1, ph=0, iw=9, kw=3, ow=9, pw=1)),
    # explicit trivial w entries agreeing with the square form; mb0 is allowed
    ("mb0ic3ih5oc4kh3sw1pw0dw0", dict(mb=0, iw=5, kw=3, ow=3)),
    # names: quotes removed, the rest kept as is (including '*', ':', '_' and 'n')
    ('ic3ih5oc4kh3n"resnet_50:res2a_branch2b*3"', dict(name="resnet_50:res2a_branch2b*3")),
    ("ic3ih5oc4kh3nplain_name", dict(name="plain_name")),
    ('ic3ih5oc4kh3n""', dict(name="")),
    ("  ic3ih5oc4kh3  ", dict(ih=5)),
]


@pytest.mark.parametrize("text, expect", OMITTED_FIELD_CASES, ids=[c[0] for c in OMITTED_FIELD_CASES])
def test_benchdnn_omitted_fields(text, expect):
    p = ConvProblem.parse(text)
    for field, value in {**DEFAULTS, **expect}.items():
        assert getattr(p, field) == value, f"{field} of {text!r}: {getattr(p, field)} != {value}"
    assert ConvProblem.parse(str(p)) == p


def test_non_descriptor_fields_come_from_arguments():
    p = ConvProblem.parse("ic3ih5oc4kh3", direction="bwd_data", dtype="float64", bias=True, device="cuda")
    assert (p.direction, p.dtype, p.bias, p.device, p.op, p.itemsize) == (
        "bwd_data", "float64", True, "cuda", "conv2d_bwd_data", 8)
    assert p != ConvProblem.parse("ic3ih5oc4kh3")
    assert str(p) == str(ConvProblem.parse("ic3ih5oc4kh3"))


BAD_DESCRIPTORS = [
    ("", "no entries"),
    ("   ", "no entries"),
    ("hello", "unrecognized entry"),
    ("ic3ih5oc4kh3 ow3", "unrecognized entry"),
    ("ic3ih5oc4kh3zz9", "unrecognized entry"),
    ("mb-1ic3ih5oc4kh3", "unrecognized entry"),
    ("mbic3ih5oc4kh3", "unrecognized entry"),
    ("ic3ih5oc4kh3ih6", "ih is given twice"),
    ("ih5oc4kh3", "ic must be given"),
    ("ic0ih5oc4kh3", "ic must be given"),
    ("ic3ih5kh3", "oc must be given"),
    ("g0ic3ih5oc4kh3", "g must be >= 1"),
    ("ic3oc4", "no spatial entries"),
    ("mb2ic3oc4n\"x\"", "no spatial entries"),
    ("ic3ih5oc4", "kh must be given"),
    ("ic3oc4kh3", "ih must be given"),
    ("ic3ih5iw5oc4kh3", "kw must be given"),
    ("ic3ih5oc4kh3sh0", "sh must be >= 1"),
    ("ic3id5ih5oc4kd1kh3", "3-D"),
    ("ic3ih2oc4kh5", "oh computes to -2 <= 0"),
    ("ic3ih3oc4kh3dh1", "oh computes to"),
    ("ic3ih5oc4kh3ph1pw0", "pw0 contradicts"),  # benchdnn would silently make pw 1
    ("ic3ih5oc4kh3sh2sw1", "sw1 contradicts"),
    ("g2ic3ih5oc4kh3", "ic \\(3\\) must be divisible by g \\(2\\)"),
    ("g2ic4ih5oc3kh3", "oc \\(3\\) must be divisible by g \\(2\\)"),
    ("ic3ih224oc64oh112kh7sh2", "oh=112 does not match"),  # benchdnn: ph 2 on top, 3 at the bottom
    ("ic3ih5oc4oh9kh3ph1", "oh=9 does not match"),
    ("ic3ih10oc4oh1kh1", "ph must be >= 0"),
    ('ic3ih5oc4kh3n"unbalanced', "name must not contain"),
    ('ic3ih5oc4kh3n"a"b"', "name must not contain"),
]


@pytest.mark.parametrize("text, why", BAD_DESCRIPTORS, ids=[c[0] or "empty" for c in BAD_DESCRIPTORS])
def test_bad_descriptors(text, why):
    with pytest.raises(ValueError, match=r"ConvProblem\.parse: .*" + re.escape(repr(text))) as e:
        ConvProblem.parse(text)
    assert re.search(why, str(e.value)), str(e.value)


def test_parse_rejects_bad_options_and_types():
    with pytest.raises(ValueError, match=r"ConvProblem\.parse: .*dtype"):
        ConvProblem.parse("ic3ih5oc4kh3", dtype="float16")
    with pytest.raises(ValueError, match=r"ConvProblem\.parse: .*direction"):
        ConvProblem.parse("ic3ih5oc4kh3", direction="bwd")
    with pytest.raises(TypeError, match=r"ConvProblem\.parse"):
        ConvProblem.parse(None)


# ------------------------------------------------------------------------------------ round trip
@st.composite
def conv_problems(draw):
    g = draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    sh, sw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    ph, pw = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    dh, dw = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    # Square problems half the time, so the short form's square rule is exercised.
    if draw(st.booleans()):
        kw, sw, pw, dw = kh, sh, ph, dh
    min_ih, min_iw = (max(1, (k - 1) * (d + 1) + 1 - 2 * p) for k, d, p in ((kh, dh, ph), (kw, dw, pw)))
    ih = draw(st.integers(min_ih, 300))
    iw = ih if ih >= min_iw and draw(st.booleans()) else draw(st.integers(min_iw, 300))
    # Names: printable text without '"' (control characters and line breaks are rejected; see INVALID_FIELDS).
    printable = st.characters(max_codepoint=0x2FF, exclude_categories=("Cc",), exclude_characters='"')
    name = draw(st.one_of(st.just(""), st.sampled_from(["resnet_50:res2a_branch2b*3", "n", "a b#c", " #x "]),
                          st.text(printable, max_size=12)))
    return ConvProblem(
        g=g, mb=draw(st.integers(0, 64)), ic=g * draw(st.integers(1, 64)), ih=ih, iw=iw,
        oc=g * draw(st.integers(1, 64)), oh=conv_output_size(ih, kh, sh, ph, dh),
        ow=conv_output_size(iw, kw, sw, pw, dw), kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw, name=name,
        direction=draw(st.sampled_from(["fwd", "bwd_data", "bwd_filter"])),
        dtype=draw(st.sampled_from(["float32", "float64"])), bias=draw(st.booleans()),
        device=draw(st.sampled_from(["cpu", "cuda"])),
    )


@given(p=conv_problems())
def test_round_trip(p):
    opts = dict(direction=p.direction, dtype=p.dtype, bias=p.bias, device=p.device)
    canonical, short = p.descriptor(), p.descriptor(canonical=False)
    assert str(p) == canonical and "\n" not in canonical
    assert canonical.startswith(f"g{p.g}mb{p.mb}ic{p.ic}ih{p.ih}iw{p.iw}oc{p.oc}oh{p.oh}ow{p.ow}kh{p.kh}kw{p.kw}"
                                f"sh{p.sh}sw{p.sw}ph{p.ph}pw{p.pw}dh{p.dh}dw{p.dw}")
    assert len(short) <= len(canonical)
    for text in (canonical, short, canonical.replace("ic", "_ic").replace("oc", "_oc"), f"  {short}  "):
        q = ConvProblem.parse(text, **opts)
        assert q == p and hash(q) == hash(p)
    assert load_problems(f"# one problem\n{canonical}\n", **opts) == [p]


def test_descriptor_forms():
    p = conv(mb=8, ic=64, ih=56, iw=56, oc=64, oh=56, ow=56, name="name")
    assert str(p) == 'g1mb8ic64ih56iw56oc64oh56ow56kh3kw3sh1sw1ph1pw1dh0dw0n"name"'
    assert p.descriptor(canonical=False) == 'mb8ic64ih56oc64oh56kh3ph1n"name"'  # benchdnn's own short form
    q = conv(g=2, mb=2, iw=9, ow=5, kw=1, sw=2, pw=0, dh=1, oh=6)
    assert q.descriptor(canonical=False) == "g2ic4ih8iw9oc6oh6ow5kh3kw1sh1sw2ph1pw0dh1dw0"
    assert "n" not in str(conv()).replace("ic", "").replace("oc", "")  # no name, no n entry


# ------------------------------------------------------------------------------- validation, values
INVALID_FIELDS = [
    (dict(g=0), "g must be >= 1"),
    (dict(mb=-1), "mb must be >= 0"),
    (dict(ic=0), "ic must be >= 1"),
    (dict(kh=0), "kh must be >= 1"),
    (dict(sw=0), "sw must be >= 1"),
    (dict(ph=-1), "ph must be >= 0"),
    (dict(dw=-1), "dw must be >= 0"),
    (dict(ih=0), "ih must be >= 1"),
    (dict(ic=2.0), "ic must be an int"),
    (dict(mb=True), "mb must be an int"),
    (dict(oh="8"), "oh must be an int"),
    (dict(g=3), r"ic \(4\) must be divisible by g \(3\)"),
    (dict(g=2, oc=3), r"oc \(3\) must be divisible by g \(2\)"),
    (dict(oh=7), "oh=7 does not match"),
    (dict(ow=9), "ow=9 does not match"),
    (dict(oh=0), "oh=0 does not match"),
    (dict(ih=1, ph=0, oh=0), "kernel does not fit"),
    (dict(kw=5, dw=1, ow=0, pw=0), "kernel does not fit"),
    (dict(name=3), "name must be a str"),
    (dict(name="two\nlines"), "control characters"),
    (dict(name="next\x85line"), "control characters"),
    (dict(name="para\u2029graph"), "control characters"),
    (dict(name='say "hi"'), "name must not contain"),
    (dict(direction="forward"), "direction must be one of"),
    (dict(dtype="float16"), "dtype must be one of"),
    (dict(dtype=np.float32), "dtype must be one of"),
    (dict(bias=1), "bias must be a bool"),
    (dict(device="gpu"), "device must be one of"),
]


@pytest.mark.parametrize("fields, why", INVALID_FIELDS, ids=[str(c[0]) for c in INVALID_FIELDS])
def test_invalid_fields(fields, why):
    with pytest.raises(ValueError, match=r"^ConvProblem: .*" + why):
        conv(**fields)


def test_replace_validates_again():
    with pytest.raises(ValueError, match="ConvProblem: oh"):
        dataclasses.replace(conv(), ih=9)
    assert dataclasses.replace(conv(), mb=0).mb == 0


def test_derived_values_and_hashing():
    p = conv(g=2, mb=3, ih=9, iw=7, oh=4, ow=7, kh=3, kw=1, sh=2, sw=1, ph=1, pw=0, dh=1, dw=0)
    assert (p.stride, p.padding, p.dilation) == ((2, 1), (1, 0), (2, 1))
    assert (p.input_shape, p.weight_shape, p.output_shape) == ((3, 4, 9, 7), (6, 2, 3, 1), (3, 6, 4, 7))
    assert p.flops == 2 * 3 * 6 * 4 * 7 * 2 * 3 * 1
    assert (p.op, p.itemsize) == ("conv2d_fwd", 4)
    assert conv(mb=0).flops == 0
    ops = {d: dataclasses.replace(p, direction=d).op for d in ("fwd", "bwd_data", "bwd_filter")}
    assert ops == {"fwd": "conv2d_fwd", "bwd_data": "conv2d_bwd_data", "bwd_filter": "conv2d_bwd_filter"}
    q = conv(g=np.int64(2), mb=np.int32(3), ih=9, iw=7, oh=4, ow=7, kh=3, kw=1, sh=2, sw=1, ph=1, pw=0, dh=1, dw=0)
    assert q == p and hash(q) == hash(p) and type(q.g) is int and str(q) == str(p)
    assert len({p, q, dataclasses.replace(p, name="x"), dataclasses.replace(p, dtype="float64")}) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.mb = 1


# ------------------------------------------------------------------------------------------ from_arrays
FROM_ARRAYS_CASES = [
    # (x_shape, w_shape, stride, padding, dilation, groups) -> (oh, ow, ph, pw)
    (((2, 4, 8, 8), (6, 4, 3, 3), 1, 1, 1, 1), (8, 8, 1, 1)),
    (((2, 4, 8, 9), (6, 2, 3, 1), (2, 1), (1, 0), (2, 1), 2), (3, 9, 1, 0)),
    (((1, 3, 7, 7), (3, 1, 5, 5), 1, "same", 1, 3), (7, 7, 2, 2)),
    (((1, 3, 7, 6), (4, 3, 3, 5), 1, "same", (2, 1), 1), (7, 6, 2, 2)),
    (((1, 3, 7, 6), (4, 3, 1, 3), [1, 1], "same", 1, 1), (7, 6, 0, 1)),
    (((1, 3, 7, 6), (4, 3, 3, 2), 1, "same", (1, 2), 1), (7, 6, 1, 1)),  # even kernel, even dilation*(k-1)
    (((0, 3, 7, 6), (4, 3, 3, 5), 3, "valid", 1, 1), (2, 1, 0, 0)),
    (((1, 1, 1, 1), (1, 1, 5, 5), 3, 2, 1, 1), (1, 1, 2, 2)),  # padding and stride larger than the input
]


@pytest.mark.parametrize("args, expect", FROM_ARRAYS_CASES, ids=[str(c[0]) for c in FROM_ARRAYS_CASES])
def test_from_arrays(args, expect):
    p = ConvProblem.from_arrays(*args)
    x_shape, w_shape, stride, padding, dilation, groups = args
    assert (p.oh, p.ow, p.ph, p.pw) == expect
    assert p.input_shape == tuple(x_shape) and p.weight_shape == tuple(w_shape) and p.g == groups
    assert p.output_shape == (x_shape[0], w_shape[0], expect[0], expect[1])
    assert p.dilation == ((dilation, dilation) if isinstance(dilation, int) else tuple(dilation))
    assert (p.direction, p.dtype, p.bias, p.device, p.name) == ("fwd", "float32", False, "cpu", "")


def test_from_arrays_options():
    p = ConvProblem.from_arrays((2, 4, 8, 8), (6, 4, 3, 3), padding=1, direction="bwd_filter", dtype=np.float64,
                                bias=True, device="cpu", name="layer")
    assert (p.op, p.dtype, p.bias, p.name) == ("conv2d_bwd_filter", "float64", True, "layer")
    assert ConvProblem.from_arrays((2, 4, 8, 8), (6, 4, 3, 3), dtype=np.dtype("float32")).dtype == "float32"
    assert p == ConvProblem.parse('mb2ic4ih8oc6kh3ph1n"layer"', direction="bwd_filter", dtype="float64", bias=True)


def test_from_arrays_matches_torch_output_shape():
    torch = pytest.importorskip("torch")
    for x_shape, w_shape, stride, padding, dilation, groups in [c[0] for c in FROM_ARRAYS_CASES]:
        y = torch.nn.functional.conv2d(torch.zeros(x_shape), torch.zeros(w_shape), None, stride, padding, dilation,
                                       groups)
        assert ConvProblem.from_arrays(x_shape, w_shape, stride, padding, dilation, groups).output_shape == y.shape


X4, W4 = (2, 4, 8, 8), (6, 4, 3, 3)
FROM_ARRAYS_ERRORS = [
    # (args, kwargs, exception, message)
    ((X4, W4), dict(stride=0), ValueError, "conv2d: stride must be >= 1, got 0"),
    ((X4, W4), dict(stride=(1, -2)), ValueError, r"conv2d: stride must be >= 1, got \(1, -2\)"),
    ((X4, W4), dict(stride=(1, 1, 1)), ValueError, "conv2d: stride must be an int or a pair of ints"),
    ((X4, W4), dict(stride=1.5), TypeError, "conv2d: stride must be an int or a pair"),
    ((X4, W4), dict(stride=None), TypeError, "conv2d: stride"),
    ((X4, W4), dict(dilation=0), ValueError, "conv2d: dilation must be >= 1, got 0"),
    ((X4, W4), dict(dilation=(1, True)), TypeError, "conv2d: dilation"),
    ((X4, W4), dict(padding=-1), ValueError, "conv2d: padding must be >= 0, got -1"),
    ((X4, W4), dict(padding=(1, 1, 1)), ValueError, "conv2d: padding must be an int, a pair of ints, 'same' or"),
    ((X4, W4), dict(padding="full"), ValueError, "conv2d: padding must be .*'same' or 'valid', got 'full'"),
    ((X4, W4), dict(padding=1.0), TypeError, "conv2d: padding"),
    ((X4, W4), dict(padding="same", stride=2), ValueError, "conv2d: padding='same' needs stride 1"),
    ((X4, (6, 4, 2, 3)), dict(padding="same"), ValueError, "conv2d: asymmetric 'same' padding is not supported"),
    ((X4, (6, 4, 3, 2)), dict(padding="same", dilation=(2, 3)), ValueError, "conv2d: asymmetric 'same'"),
    ((X4, W4), dict(groups=0), ValueError, "conv2d: groups must be >= 1, got 0"),
    ((X4, W4), dict(groups=2.0), TypeError, "conv2d: groups must be an int"),
    ((X4, (6, 1, 3, 3)), dict(groups=3), ValueError, "conv2d: groups must divide in_channels"),
    ((X4, (5, 2, 3, 3)), dict(groups=2), ValueError, "conv2d: groups must divide out_channels"),
    ((X4, (6, 3, 3, 3)), {}, ValueError,
     "conv2d: weight has 3 input channels per group but input has 4 channels with groups=1"),
    ((X4, (6, 4, 3, 3)), dict(groups=2), ValueError, "conv2d: weight has 4 input channels per group"),
    (((2, 4, 8), W4), {}, ValueError, r"conv2d: input must be 4-D \(N, C, H, W\), got shape \(2, 4, 8\)"),
    ((X4, (6, 4, 3)), {}, ValueError, "conv2d: weight must be 4-D"),
    (((2, 4, 8, 8, 1), W4), {}, ValueError, "conv2d: input must be 4-D"),
    (((2, -4, 8, 8), W4), {}, ValueError, "conv2d: input shape must not be negative"),
    (("2488", W4), {}, TypeError, "conv2d: input shape must be a sequence of ints"),
    (((2, 4, 8.0, 8), W4), {}, TypeError, "conv2d: input shape"),
    ((X4, 3), {}, TypeError, "conv2d: weight shape"),
    (((2, 0, 8, 8), (6, 0, 3, 3)), {}, ValueError, "conv2d: input must have at least one channel"),
    (((2, 4, 0, 8), W4), dict(padding=1), ValueError, "conv2d: input height must be >= 1"),
    ((X4, (0, 4, 3, 3)), {}, ValueError, "conv2d: weight out_channels must be >= 1"),
    ((X4, (6, 4, 3, 0)), {}, ValueError, "conv2d: weight kernel width must be >= 1"),
    (((2, 4, 2, 8), W4), {}, ValueError, "conv2d: the output would be empty: .*height"),
    (((2, 4, 8, 4), (6, 4, 3, 3)), dict(dilation=2), ValueError, "conv2d: the output would be empty: .*width"),
    ((X4, W4), dict(dtype="int8"), ValueError, "conv2d: ConvProblem: dtype"),
    ((X4, W4), dict(dtype=np.int32), ValueError, "conv2d: ConvProblem: dtype"),
    ((X4, W4), dict(direction="sideways"), ValueError, "conv2d: ConvProblem: direction"),
    ((X4, W4), dict(stride=0, op="conv2d_backward_data"), ValueError, "conv2d_backward_data: stride must be >= 1"),
    ((X4, (6, 3, 3, 3)), dict(op="conv2d_backward_filter"), ValueError, "conv2d_backward_filter: weight has 3"),
]


@pytest.mark.parametrize("args, kwargs, exc, message", FROM_ARRAYS_ERRORS,
                         ids=[f"{i}-{c[3][:40]}" for i, c in enumerate(FROM_ARRAYS_ERRORS)])
def test_from_arrays_errors(args, kwargs, exc, message):
    with pytest.raises(exc, match="^" + message):
        ConvProblem.from_arrays(*args, **kwargs)
