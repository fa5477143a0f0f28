"""The operators: validate the call, build its Problem, run the plan dispatch returns.

dense.py        gemm, linear, linear_backward              (host arrays; GPU arrays go to gpu_dense.py)
convolution.py  conv2d and its backward passes             (host arrays)
recurrent.py    lstm, gru, rnn, their cells and backward   (host arrays; GPU arrays go to gpu_recurrent.py)
candidates.py   explain()

None of them imports the kernel module: the algorithms (algos/) and backends (backends/) do.
"""
from __future__ import annotations

from .convolution import conv2d, conv2d_backward_bias, conv2d_backward_data, conv2d_backward_filter
from .candidates import explain
from .dense import gemm, linear, linear_backward
from .recurrent import (
    RnnReserve, gru, gru_backward, gru_cell, gru_cell_backward, lstm, lstm_backward, lstm_cell, lstm_cell_backward,
    rnn, rnn_backward, rnn_cell_backward, rnn_relu_cell, rnn_tanh_cell,
)

__all__ = [
    "gemm", "linear", "linear_backward", "conv2d", "conv2d_backward_data", "conv2d_backward_filter",
    "conv2d_backward_bias", "explain", "lstm", "gru", "rnn", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "lstm_backward", "gru_backward", "rnn_backward", "lstm_cell_backward", "gru_cell_backward",
    "rnn_cell_backward", "RnnReserve",
]
