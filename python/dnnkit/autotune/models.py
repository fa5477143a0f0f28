"""Layer lists of real networks that `dnnkit autotune --model NAME` tunes, and problem files.

resnet50: the 20 distinct convolutions of ResNet-50 v1 (data/resnet50_conv.txt, benchdnn's list) and
    its 2048 -> 1000 classifier, at minibatch mb.
lstm: LSTM layers of hidden sizes 256, 512 and 1024 over 50 steps at minibatch mb, as the fused sequence
    (forward, or backward through time for a backward direction; a two-layer stack at 256), and the
    GEMMs such a layer runs: the input projection of all steps at once (50*mb rows, 4H outputs, fused
    bias) and the recurrent projection of one step (mb rows).
fc: fully-connected layers: BERT-base's (768 -> 768, 768 -> 3072, 3072 -> 768, over mb sequences of 128
    tokens) and VGG-16's classifier (25088 -> 4096, 4096 -> 4096, 4096 -> 1000, mb rows).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..problem import DATA_DIR, GemmProblem, RnnProblem, _strip_comment, load_problems, parse_descriptor

_LSTM_STEPS = 50


def _linear(rows: int, n_in: int, n_out: int, dtype: str, bias: bool = True) -> GemmProblem:
    """y = x W^T + b for x of rows x n_in: the GEMM linear() runs."""
    return GemmProblem(rows, n_out, n_in, trans_b=True, bias=bias, dtype=dtype)


def _resnet50(mb, direction, dtype):
    convs = load_problems(DATA_DIR / "resnet50_conv.txt", direction=direction, dtype=dtype)
    out = [dataclasses.replace(p, mb=mb) for p in convs]
    if direction == "fwd":
        out.append(_linear(mb, 2048, 1000, dtype))
    return out


def _lstm(mb, direction, dtype):
    rnn_direction = "fwd" if direction == "fwd" else "bwd"
    out = [RnnProblem("lstm", _LSTM_STEPS, mb, h, h, layers=layers, direction=rnn_direction, dtype=dtype)
           for h, layers in ((256, 1), (256, 2), (512, 1), (1024, 1))]
    for h in (256, 512, 1024):
        out.append(_linear(_LSTM_STEPS * mb, h, 4 * h, dtype))
        out.append(_linear(mb, h, 4 * h, dtype, bias=False))
    return out


def _fc(mb, direction, dtype):
    tokens = 128 * mb
    return [
        _linear(tokens, 768, 768, dtype), _linear(tokens, 768, 3072, dtype), _linear(tokens, 3072, 768, dtype),
        _linear(mb, 25088, 4096, dtype), _linear(mb, 4096, 4096, dtype), _linear(mb, 4096, 1000, dtype),
    ]


MODELS = {"resnet50": _resnet50, "lstm": _lstm, "fc": _fc}


def model_problems(name: str, *, mb: int = 8, direction: str = "fwd", dtype: str = "float32") -> list:
    """The problems of a named layer list (see the module docstring); direction applies to convolutions."""
    make = MODELS.get(name)
    if make is None:
        raise ValueError(f"autotune: unknown model {name!r}; known: {sorted(MODELS)}")
    if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
        raise ValueError(f"autotune: mb must be an int >= 1, got {mb!r}")
    return make(mb, direction, dtype)


def load_batch(path, *, direction: str = "fwd", dtype: str = "float32") -> list:
    """Problems from a file of descriptors, one a line (GEMM or benchdnn convolution; '#' comments)."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"autotune: cannot read {source}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"autotune: {source} is not a text file") from None
    problems = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = _strip_comment(line).strip()
        if line:
            try:
                problems.append(parse_descriptor(line, direction=direction, dtype=dtype))
            except ValueError as e:
                raise ValueError(f"autotune: {source}, line {lineno}: {e}") from None
    if not problems:
        raise ValueError(f"autotune: {source} holds no problem descriptors")
    return problems
