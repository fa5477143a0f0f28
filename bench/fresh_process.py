"""Calls repeated alone in a fresh process, dnnkit beside PyTorch CPU: time and minor page faults a call.

    python bench/fresh_process.py [--threads N] [--seconds S] [--rounds R] [--markdown]

bench/rnn.py and bench/gemm.py time every problem in one long process, after many calls of every size.
What a call costs there can differ from what it costs in a program that makes only that call: whether
glibc serves a buffer of a few hundred KB from its heap, hands the heap's top back at every free, or maps
the buffer apart depends on what the process allocated before, and a buffer taken afresh faults in a page
per 4 KiB on every call. Here each case runs in its own new process, once for dnnkit and once for torch
(alternating which goes first over the rounds): three calls to warm up, then calls for S seconds;
getrusage counts the minor page faults. Reported: medians over the rounds, and the ratio torch/dnnkit.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np

# Each case: (name, data, setup for dnnkit, setup for torch). Both libraries get the same arrays, made
# by `data` from one seed; weights are drawn as torch initializes its modules (uniform in +-1/sqrt(H)),
# so that the gates are not saturated: saturated gates make gradients below the smallest normal float,
# whose arithmetic is many times slower on x86, and would time that instead. A setup defines call().
_COMMON = ("import numpy as np\nr = np.random.default_rng(0)\n"
           "def R(*s): return r.standard_normal(s, dtype=np.float32)\n"
           "def U(k, *s): return (r.uniform(-1, 1, s) / np.sqrt(k)).astype(np.float32)\n")
# torch's side: tensors from the arrays (a copy each) and a module's parameters, in order, from a list.
_TORCH = ("def T(a, grad=False): return torch.from_numpy(a.copy()).requires_grad_(grad)\n"
          "def load(m, ws):\n"
          "    with torch.no_grad():\n"
          "        for p, w in zip(m.parameters(), ws, strict=True): p.copy_(torch.from_numpy(w))\n"
          "    return m\n")
CASES = [
    ("gru_cell H256 B64",
     "x, h, w = R(64, 256), R(64, 256), [U(256, 768, 256), U(256, 768, 256), U(256, 768), U(256, 768)]\n",
     "def call(): dnnkit.gru_cell(x, h, *w)\n",
     "m = load(torch.nn.GRUCell(256, 256), w); x, h = T(x), T(h)\n"
     "def call():\n    with torch.no_grad(): m(x, h)\n"),
    ("gru_cell H1024 B64",
     "x, h, w = R(64, 1024), R(64, 1024), [U(1024, 3072, 1024), U(1024, 3072, 1024), U(1024, 3072), U(1024, 3072)]\n",
     "def call(): dnnkit.gru_cell(x, h, *w)\n",
     "m = load(torch.nn.GRUCell(1024, 1024), w); x, h = T(x), T(h)\n"
     "def call():\n    with torch.no_grad(): m(x, h)\n"),
    ("lstm_cell H256 B64",
     "x, h, c = R(64, 256), R(64, 256), R(64, 256)\n"
     "w = [U(256, 1024, 256), U(256, 1024, 256), U(256, 1024), U(256, 1024)]\n",
     "def call(): dnnkit.lstm_cell(x, (h, c), *w)\n",
     "m = load(torch.nn.LSTMCell(256, 256), w); x, h, c = T(x), T(h), T(c)\n"
     "def call():\n    with torch.no_grad(): m(x, (h, c))\n"),
    ("lstm_cell H512 B64 fwd+bwd",
     "x, h, c = R(64, 512), R(64, 512), R(64, 512)\n"
     "w = [U(512, 2048, 512), U(512, 2048, 512), U(512, 2048), U(512, 2048)]; g = np.ones((64, 512), np.float32)\n",
     "def call():\n    (h2, c2), res = dnnkit.lstm_cell(x, (h, c), *w, train=True)\n"
     "    dnnkit.lstm_cell_backward(g, None, res)\n",
     "m = load(torch.nn.LSTMCell(512, 512), w); x, h, c = T(x, True), T(h, True), T(c, True)\n"
     "def call():\n    m.zero_grad(set_to_none=True); x.grad = h.grad = c.grad = None\n"
     "    h2, c2 = m(x, (h, c)); h2.backward(torch.ones_like(h2))\n"),
    ("lstm H256 B64 T50 fwd+bwd",
     "x = R(50, 64, 256); w = [U(256, 1024, 256), U(256, 1024, 256), U(256, 1024), U(256, 1024)]\n"
     "g = np.ones((50, 64, 256), np.float32)\n",
     "def call():\n    out, _, res = dnnkit.lstm(x, None, None, w, train=True)\n"
     "    dnnkit.lstm_backward(g, None, None, res)\n",
     "m = load(torch.nn.LSTM(256, 256), w); x, g = T(x, True), T(g)\n"
     "def call():\n    m.zero_grad(set_to_none=True); x.grad = None\n    out, _ = m(x); out.backward(g)\n"),
    ("lstm H256 B16 T50 2 layers bidirectional",
     "x = R(50, 16, 256)\n"
     "w = [U(256, 1024, 256), U(256, 1024, 256), U(256, 1024), U(256, 1024)] * 2 + \\\n"
     "    [U(256, 1024, 512), U(256, 1024, 256), U(256, 1024), U(256, 1024)] * 2\n",
     "def call(): dnnkit.lstm(x, None, None, w, num_layers=2, bidirectional=True)\n",
     "m = load(torch.nn.LSTM(256, 256, num_layers=2, bidirectional=True), w); x = T(x)\n"
     "def call():\n    with torch.no_grad(): m(x)\n"),
    ("linear 256x1024x1024 fwd+bwd",
     "x, w, b = R(256, 1024), U(1024, 1024, 1024), U(1024, 1024); g = np.ones((256, 1024), np.float32)\n",
     "def call():\n    dnnkit.linear(x, w, b); dnnkit.linear_backward(g, x, w)\n",
     "m = load(torch.nn.Linear(1024, 1024), [w, b]); x, g = T(x, True), T(g)\n"
     "def call():\n    m.zero_grad(set_to_none=True); x.grad = None; m(x).backward(g)\n"),
]

_RUN = """
import resource, sys, time
for _ in range(3): call()
n0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t0 = time.perf_counter(); n = 0
while time.perf_counter() - t0 < {seconds}:
    call(); n += 1
t = (time.perf_counter() - t0) / n
print(t, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - n0) / n)
"""


def _one(lib, data, setup, threads, seconds):
    head = (f"import dnnkit\ndnnkit.set_num_threads({threads})\n" if lib == "dnnkit"
            else f"import torch\ntorch.set_num_threads({threads})\n" + _TORCH)
    code = head + _COMMON + data + setup + _RUN.format(seconds=seconds)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"),
                                                    env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    t, faults = out.stdout.split()
    return float(t), float(faults)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="threads for both libraries (default 2)")
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds of calls a process (default 1)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per case and library (default 2)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table for bench/RESULTS.md")
    args = ap.parse_args(argv)
    hdr = ("call", "dnnkit us", "dnnkit faults", "torch us", "torch faults", "ratio")
    if args.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    else:
        print(f"{hdr[0]:<42} {hdr[1]:>10} {hdr[2]:>14} {hdr[3]:>10} {hdr[4]:>13} {hdr[5]:>6}")
    for name, data, ours, theirs in CASES:
        got = {"dnnkit": [], "torch": []}
        for r in range(args.rounds):
            order = (("dnnkit", ours), ("torch", theirs)) if r % 2 == 0 else (("torch", theirs), ("dnnkit", ours))
            for lib, setup in order:
                got[lib].append(_one(lib, data, setup, args.threads, args.seconds))
        t_o, f_o = (float(np.median([g[i] for g in got["dnnkit"]])) for i in (0, 1))
        t_t, f_t = (float(np.median([g[i] for g in got["torch"]])) for i in (0, 1))
        if args.markdown:
            print(f"| {name} | {1e6 * t_o:.0f} | {f_o:.0f} | {1e6 * t_t:.0f} | {f_t:.0f} | {t_t / t_o:.2f} |")
        else:
            print(f"{name:<42} {1e6 * t_o:>10.0f} {f_o:>14.0f} {1e6 * t_t:>10.0f} {f_t:>13.0f} {t_t / t_o:>6.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
