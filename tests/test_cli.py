"""The `dnnkit` command line, run as a separate process (`python -m dnnkit` and the console script)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

import dnnkit


def run(*args, module=True):
    cmd = [sys.executable, "-m", "dnnkit", *args] if module else [*args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_info_json():
    r = run("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert {"version", "isa_active", "threads"} <= info.keys()
    assert info["version"] == dnnkit.__version__
    assert info["isa_active"] in ("ref", "avx2", "avx512")
    assert isinstance(info["threads"], int) and info["threads"] >= 1


def test_info_blocking_fits_l2():
    """Each dtype's packed B block (KC x NC) fills at most two thirds of the L2 that info reports, or NC
    is at its floor of 128 columns; NC is a multiple of NR."""
    info = dnnkit.info()
    l2 = info["l2_cache_bytes"]
    assert isinstance(l2, int) and l2 > 0
    for dtype, u in info["ukernels"].items():
        size = 4 if dtype == "float32" else 8
        assert u["NC"] % u["NR"] == 0
        assert u["NC"] == 128 or u["KC"] * u["NC"] * size <= 2 * l2 // 3, (dtype, u, l2)


def test_info_text():
    r = run("info")
    assert r.returncode == 0, r.stderr
    assert "version" in r.stdout and "ukernel float32" in r.stdout


def test_explain_console_script():
    exe = shutil.which("dnnkit")
    if exe is None:
        pytest.skip("the dnnkit console script is not on PATH (package not installed)")
    r = run(exe, "explain", "m8n8k8_f32", module=False)
    assert r.returncode == 0, r.stderr
    assert "blocked_gemm" in r.stdout and "m8n8k8_f32" in r.stdout


def test_explain_module():
    r = run("explain", "m8n8k8_f32")
    assert r.returncode == 0, r.stderr
    assert "blocked_gemm" in r.stdout


def test_explain_garbage_is_a_one_line_error():
    r = run("explain", "garbage")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dnnkit: error:") and "garbage" in lines[0]
    assert "Traceback" not in r.stderr


def test_no_command_prints_help():
    r = run()
    assert r.returncode != 0
    assert "usage" in r.stdout.lower()


# ---------------------------------------------------------------------------------- autotune and cache
def tune_env(tmp_path):
    return dict(os.environ, DNNKIT_CACHE_DIR=str(tmp_path))


def run_in(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "dnnkit", *args], capture_output=True, text=True, timeout=300,
                          env=tune_env(tmp_path))


def one_line_error(r, *words):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dnnkit: error:") and "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_autotune_problem_json(tmp_path):
    r = run_in(tmp_path, "autotune", "--problem", "mb2ic8ih12oc8oh12kh3ph1", "--problem", "m8n32k16tb_f32",
               "--budget", "0.02", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["op"] for p in doc["problems"]] == ["conv2d_fwd", "gemm"]
    for p in doc["problems"]:
        assert p["source"] == "measured" and p["best"] == p["records"][0]["algorithm"]
        assert p["records"][0]["status"] == "ok" and p["records"][0]["median_s"] > 0
    assert doc["summary"]["tuned"] == 2 and doc["summary"]["measured"] == 2
    # A second run answers from the cache; --force measures again.
    again = json.loads(run_in(tmp_path, "autotune", "--problem", "mb2ic8ih12oc8oh12kh3ph1", "--json").stdout)
    assert again["problems"][0]["source"] == "cache"
    assert again["problems"][0]["best"] == doc["problems"][0]["best"]
    forced = run_in(tmp_path, "autotune", "--problem", "mb2ic8ih12oc8oh12kh3ph1", "--json", "--force",
                    "--budget", "0.01")
    assert json.loads(forced.stdout)["problems"][0]["source"] == "measured"


def test_autotune_no_prune_times_what_a_cached_result_pruned(tmp_path):
    """--no-prune tunes again a problem whose cached result left candidates untimed (pruned)."""
    args = ("autotune", "--problem", "mb1ic32ih28oc32oh28kh5ph2", "--json", "--budget", "0.01")
    first = json.loads(run_in(tmp_path, *args).stdout)["problems"][0]
    pruned = {r["algorithm"] for r in first["records"] if r["status"] == "pruned"}
    assert "fft" in pruned  # predicted several times slower than the direct and GEMM paths at 5x5
    again = json.loads(run_in(tmp_path, *args, "--no-prune").stdout)["problems"][0]
    assert again["source"] == "measured"
    assert all(r["status"] == "ok" for r in again["records"] if r["algorithm"] in pruned)
    cached = json.loads(run_in(tmp_path, *args, "--no-prune").stdout)["problems"][0]
    assert cached["source"] == "cache"


def test_autotune_conv2d_shapes_table(tmp_path):
    r = run_in(tmp_path, "autotune", "conv2d", "--input", "2,4,9,9", "--weight", "6,4,3,3", "--stride", "2",
               "--padding", "1", "--direction", "bwd_filter", "--budget", "0.02")
    assert r.returncode == 0, r.stderr
    assert "conv2d_bwd_filter" in r.stdout and "median ms" in r.stdout and "* " in r.stdout
    assert "tuned 1 of 1" in r.stdout


def test_autotune_batch_file_and_workspace_limit(tmp_path):
    batch = tmp_path / "layers.txt"
    batch.write_text("# two layers\nmb2ic8ih12oc8oh12kh3ph1  # 3x3\nm4n8k8tb_bias_f32\n")
    r = run_in(tmp_path, "autotune", "--batch", str(batch), "--budget", "0.02", "--workspace-limit", "1K", "--json",
               "--no-prune")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["problems"]) == 2
    for rec in doc["problems"][0]["records"]:
        assert rec["status"] in ("ok", "over_limit", "unsupported")
        if rec["status"] == "ok":
            assert rec["workspace_bytes"] <= 1024


def test_autotune_model_list(tmp_path):
    r = run_in(tmp_path, "autotune", "--model", "lstm", "--mb", "1", "--budget", "0.01")
    assert r.returncode == 0, r.stderr
    assert "tuned 10 of 10" in r.stdout and "gemm_small_m" in r.stdout and "fused_units" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["autotune", "--problem", "garbage"], ["garbage"]),
    (["autotune", "--frobnicate"], ["--frobnicate"]),
    (["autotune"], ["exactly one"]),
    (["autotune", "--model", "resnet50", "--problem", "m1n1k1"], ["exactly one"]),
    (["autotune", "conv2d", "--input", "1,2,3"], ["--input"]),
    (["autotune", "conv2d", "--input", "1,2,8,8", "--weight", "3,5,3,3"], ["weight"]),
    (["autotune", "--problem", "m4n4k4", "--workspace-limit", "lots"], ["workspace-limit"]),
    (["autotune", "--problem", "m4n4k4", "--budget", "-1"], ["budget"]),
    (["autotune", "--batch", "/nonexistent/file.txt"], ["cannot read"]),
    (["autotune", "--problem", "mb2ic8ih12oc8oh12kh3ph1", "--device", "cuda"], ["cuda"]),
    (["cache", "frob"], ["frob"]),
    (["cache", "import", "/nonexistent/x.json"], ["cannot read"]),
    (["cache", "show"], ["descriptor"]),
    (["autotune", "--problem", "m4n4k4", "--plot", "roofline.txt"], ["autotune --plot", "roofline.txt", ".png"]),
    (["autotune", "--problem", "m4n4k4", "--plot", "/nonexistent/dir/x.png"], ["autotune --plot", "/nonexistent"]),
    # --direction against the kind of descriptor: a GEMM has none, an RNN fwd or bwd, a convolution three.
    (["autotune", "--problem", "m8n16k32tb_f32", "--direction", "bwd"], ["autotune --problem", "--direction bwd",
                                                                          "GEMM", "no direction"]),
    (["autotune", "--problem", "mb1ic4ih8oc4kh3ph1", "--problem", "m8n8k8", "--direction", "bwd_data"],
     ["autotune --problem", "--direction bwd_data", "'m8n8k8'", "GEMM"]),
    (["autotune", "--problem", "lstm_l1t2mb2slc4sic4", "--direction", "bwd_data"],
     ["autotune --problem", "--direction bwd_data", "RNN", "fwd or bwd"]),
    (["autotune", "--problem", "mb1ic4ih8oc4kh3ph1", "--direction", "bwd"],
     ["autotune --problem", "--direction bwd", "convolution", "fwd, bwd_data or bwd_filter"]),
    (["autotune", "conv2d", "--input", "1,4,8,8", "--weight", "4,4,3,3", "--direction", "bwd"],
     ["autotune conv2d", "--direction bwd", "fwd, bwd_data or bwd_filter"]),
    (["explain", "m64n64k64", "--direction", "bwd_filter"], ["explain", "--direction bwd_filter", "GEMM"]),
    (["explain", "lstm_l1t2mb2slc4sic4", "--direction", "bwd_filter"], ["explain", "--direction bwd_filter", "RNN"]),
    (["explain", "mb1ic4ih8oc4kh3ph1", "--direction", "bwd"], ["explain", "--direction bwd", "convolution"]),
    (["cache", "show", "m8n8k8", "--direction", "bwd"], ["cache show", "--direction bwd", "GEMM"]),
    (["cache", "show", "lstm_l1t2mb2slc4sic4", "--direction", "bwd_data"], ["cache show", "--direction bwd_data"]),
    # cache show KEY: the operator must fit the descriptor and agree with --direction and --dtype.
    (["cache", "show", "gru_fwd lstm_l1t2mb2slc4sic4_f32"], ["cache show", "gru_fwd", "not a key"]),
    (["cache", "show", "conv2d_fwd m8n8k8_f32"], ["cache show", "conv2d_fwd", "not a key"]),
    (["cache", "show", "lstm_bwd"], ["cache show", "lstm_bwd", "not a key"]),
    (["cache", "show", "lstm_bwd lstm_l1t2mb2slc4sic4_f32", "--direction", "fwd"], ["cache show", "--direction fwd"]),
    (["cache", "show", "conv2d_fwd mb1ic4ih8oc4kh3ph1 float64 cpu", "--dtype", "float32"],
     ["cache show", "--dtype float32", "float64"]),
    (["cache", "show", "garbage"], ["cache show", "garbage"]),
    (["cache", "clear", "gemm", "m8n8k8"], ["cache clear", "one argument", "'gemm m8n8k8'"]),
    # --padding: an int, a pair, same or valid (same: stride 1, as conv2d and torch)
    (["autotune", "conv2d", "--input", "1,4,8,8", "--weight", "4,4,3,3", "--padding", "sam"],
     ["--padding", "'same'", "'valid'", "sam"]),
    (["autotune", "conv2d", "--input", "1,4,8,8", "--weight", "4,4,3,3", "--padding", "same", "--stride", "2"],
     ["autotune conv2d", "'same'", "stride 1"]),
])
def test_bad_input_is_a_one_line_error(tmp_path, args, words):
    one_line_error(run_in(tmp_path, *args), *words)


def test_cache_commands(tmp_path):
    r = run_in(tmp_path, "cache", "path")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "tuning.sqlite3")
    assert "no tuning results" in run_in(tmp_path, "cache", "list").stdout
    assert run_in(tmp_path, "autotune", "--problem", "m8n32k16tb_f32", "--budget", "0.01").returncode == 0
    listed = run_in(tmp_path, "cache", "list")
    assert listed.returncode == 0 and "gemm m8n32k16tb_f32" in listed.stdout and listed.stdout.count("\n* ") == 1
    rows = json.loads(run_in(tmp_path, "cache", "list", "--json").stdout)
    assert len(rows) == 1 and rows[0]["problem"] == "gemm m8n32k16tb_f32"
    shown = run_in(tmp_path, "cache", "show", "m8n32k16tb_f32")
    assert shown.returncode == 0 and "gemm_small_m" in shown.stdout
    missing = run_in(tmp_path, "cache", "show", "m9n32k16tb_f32")
    assert missing.returncode == 1 and "no tuning result" in missing.stderr
    export = tmp_path / "export.json"
    assert run_in(tmp_path, "cache", "export", str(export)).returncode == 0
    refused = run_in(tmp_path, "cache", "clear")
    assert refused.returncode == 2 and "--all" in refused.stderr  # no pattern: nothing is wiped by accident
    assert "no tuning results match" in run_in(tmp_path, "cache", "clear", "m9n32").stdout
    assert "removed 1" in run_in(tmp_path, "cache", "clear", "m8n32").stdout
    assert run_in(tmp_path, "cache", "show", "m8n32k16tb_f32").returncode == 1
    assert run_in(tmp_path, "cache", "import", str(export)).returncode == 0
    assert "removed 1" in run_in(tmp_path, "cache", "clear", "--all").stdout
    assert run_in(tmp_path, "cache", "show", "m8n32k16tb_f32").returncode == 1
    imported = run_in(tmp_path, "cache", "import", str(export))
    assert imported.returncode == 0 and "imported 1 of 1" in imported.stdout
    assert run_in(tmp_path, "cache", "show", "m8n32k16tb_f32").returncode == 0
    export.write_text('{"format": "something else"}')
    one_line_error(run_in(tmp_path, "cache", "import", str(export)), "not a file written by")


def test_autotune_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    r = run_in(tmp_path, "autotune", "--problem", "mb2ic8ih12oc8oh12kh3ph1", "--budget", "0.02", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_autotune_plot_with_rnn_problems(tmp_path):
    """RNN problems (forward and backward) have a place on the roofline beside GEMMs and convolutions."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    r = run_in(tmp_path, "autotune", "--problem", "lstm_l1t2mb2slc4sic4", "--problem", "m8n16k32tb_f32",
               "--problem", "mb1ic4ih8oc4kh3ph1", "--budget", "0.02", "--plot", str(png))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"roofline written to {png}" in r.stdout
    png.unlink()
    r = run_in(tmp_path, "autotune", "--problem", "gru_l2t2mb2slc4sic4_bidir", "--direction", "bwd", "--budget",
               "0.02", "--plot", str(png))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_rnn_problem_moves_its_input_weights_output_and_final_states():
    from dnnkit.cli import _problem_bytes
    from dnnkit.problem import RnnProblem

    # T=2, B=3, I=4, H=5: x 24; W_ih 80, W_hh 100, biases 40; output 30; h_n and c_n 15 each.
    lstm = RnnProblem("lstm", 2, 3, 4, 5)
    assert _problem_bytes(lstm) == (24 + 80 + 100 + 40 + 30 + 30) * 4
    assert _problem_bytes(dataclasses.replace(lstm, direction="bwd")) == 2 * _problem_bytes(lstm)
    assert _problem_bytes(dataclasses.replace(lstm, dtype="float64")) == 2 * _problem_bytes(lstm)
    # GRU without biases: no c_n.
    assert _problem_bytes(RnnProblem("gru", 2, 3, 4, 5, bias=False)) == (24 + 60 + 75 + 30 + 15) * 4
    # Two bidirectional layers with a projection P=2: layer 1 reads both directions' P-wide outputs; W_hr
    # is P x H; the output and h_n are P wide, c_n H wide.
    p = RnnProblem("lstm", 2, 3, 4, 5, layers=2, dirs=2, proj=2)
    weights = 2 * (20 * (4 + 2) + 40 + 10) + 2 * (20 * (4 + 2) + 40 + 10)
    assert _problem_bytes(p) == (24 + weights + 2 * 3 * 2 * 2 + 2 * 2 * 3 * (2 + 5)) * 4


def test_cache_show_takes_the_keys_cache_list_prints(tmp_path):
    """`cache show` takes a key as `cache list` prints it (its operator gives the direction; the words after
    the key are ignored), and on a miss names the results stored for the same descriptor in another
    direction or dtype."""
    assert run_in(tmp_path, "autotune", "--problem", "lstm_l1t2mb2slc4sic4", "--direction", "bwd",
                  "--budget", "0.01").returncode == 0
    assert run_in(tmp_path, "autotune", "--problem", "mb1ic4ih8oc4kh3ph1", "--direction", "bwd_data", "--dtype",
                  "float64", "--budget", "0.01").returncode == 0
    assert run_in(tmp_path, "autotune", "--problem", "m8n16k32tb_f32", "--budget", "0.01").returncode == 0
    listed = run_in(tmp_path, "cache", "list")
    assert listed.returncode == 0, listed.stderr
    lines = [line for line in listed.stdout.splitlines()[1:] if line.strip()]
    keys = [x["problem"] for x in json.loads(run_in(tmp_path, "cache", "list", "--json").stdout)]
    assert len(lines) == len(keys) == 3
    for key, line in zip(keys, lines):
        # The key; the line, with and without its mark; the key's words unquoted.
        for words in ([key], [line], [line[2:]], key.split()):
            r = run_in(tmp_path, "cache", "show", *words)
            assert r.returncode == 0, (words, r.stderr)
            assert r.stdout.startswith(key.split(" ")[0] + " ") and "median ms" in r.stdout, r.stdout
    for text in ("gemm m8n16k32tb_f32", "lstm_bwd lstm_l1t2mb2slc4sic4_f32", "lstm_bwd lstm_l1t2mb2slc4sic4",
                 "conv2d_bwd_data mb1ic4ih8oc4kh3ph1 float64"):
        r = run_in(tmp_path, "cache", "show", text)
        assert r.returncode == 0, (text, r.stderr)
    # A descriptor with --direction and --dtype, as before.
    assert run_in(tmp_path, "cache", "show", "mb1ic4ih8oc4kh3ph1", "--direction", "bwd_data", "--dtype",
                  "float64").returncode == 0
    # Misses name what is stored for the same descriptor.
    r = run_in(tmp_path, "cache", "show", "lstm_l1t2mb2slc4sic4")
    assert r.returncode == 1 and "no tuning result for lstm_fwd" in r.stderr, r.stderr
    assert "'lstm_bwd lstm_l1t2mb2slc4sic4_f32 float32 bias cpu'" in r.stderr
    r = run_in(tmp_path, "cache", "show", "mb1ic4ih8oc4kh3ph1")
    assert r.returncode == 1 and "conv2d_bwd_data g1mb1ic4ih8iw8oc4oh8ow8kh3kw3sh1sw1ph1pw1dh0dw0 float64" in r.stderr
    r = run_in(tmp_path, "cache", "show", "m8n16k32tb_f64")
    assert r.returncode == 1 and "'gemm m8n16k32tb_f32'" in r.stderr, r.stderr
    r = run_in(tmp_path, "cache", "show", "m9n16k32tb_f32")
    assert r.returncode == 1 and "the cache has" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_autotune_conv2d_takes_same_and_valid_padding(tmp_path):
    """--padding same and valid, as conv2d takes them: an odd kernel pads symmetrically; an even one (torch
    pads one more on the bottom/right) tunes the problem conv2d runs, its input grown by that row/column."""
    from dnnkit.autotune.cache import problem_key
    from dnnkit.problem import ConvProblem

    cases = [(["--weight", "4,4,3,3", "--padding", "same"], ConvProblem.from_arrays((1, 4, 8, 8), (4, 4, 3, 3), 1, 1)),
             (["--weight", "4,4,3,3", "--padding", "valid"], ConvProblem.from_arrays((1, 4, 8, 8), (4, 4, 3, 3))),
             (["--weight", "4,4,2,3", "--padding", "same"],
              ConvProblem.from_arrays((1, 4, 9, 8), (4, 4, 2, 3), 1, (0, 1)))]
    for args, want in cases:
        r = run_in(tmp_path, "autotune", "conv2d", "--input", "1,4,8,8", *args, "--budget", "0.01", "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)["problems"][0]
        assert got["problem"] == problem_key(want) and (want.oh, want.ow) == ((8, 8) if "same" in args else (6, 6))


@pytest.mark.parametrize("name,value,expect", [
    ("DNNKIT_TUNING", "bogus", "get_tuning() == 'heuristic'"),
    ("DNNKIT_NUM_THREADS", "two", "get_num_threads() >= 1"),
    ("DNNKIT_NUM_THREADS", "0", "get_num_threads() >= 1"),
    ("DNNKIT_NUM_THREADS", "100000", "get_num_threads() <= 1024"),
    ("DNNKIT_WORKSPACE_LIMIT", "lots", "get_workspace_limit() is None"),
    ("DNNKIT_ALGO_LINEAR", "gemm_goto", "_config.algo_overrides() == {}"),
    ("DNNKIT_ALGO_FOO", "bar", "_config.algo_overrides() == {}"),
    ("DNNKIT_BLOCK_CACHE_MB", "abc", "info()['block_cache_bytes'] >= 0"),
    ("DNNKIT_BLOCK_CACHE_MB", "-5", "info()['block_cache_bytes'] >= 0"),
    ("DNNKIT_AMX", "maybe", "get_amx() == dnnkit._cpu.amx_available()"),
])
def test_a_bad_environment_variable_is_ignored_with_a_warning(name, value, expect):
    env = dict(os.environ, **{name: value})
    r = subprocess.run([sys.executable, "-c", f"import dnnkit; assert dnnkit.{expect}; print('ok')"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert name in r.stderr and "Traceback" not in r.stderr


def test_the_workspace_limit_variable_takes_units_as_the_option_does():
    env = dict(os.environ, DNNKIT_WORKSPACE_LIMIT="64M")
    r = subprocess.run([sys.executable, "-c", "import dnnkit; print(dnnkit.get_workspace_limit())"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == [str(64 << 20)], r.stderr


def test_a_closed_pipe_ends_the_command_quietly():
    """`dnnkit ... | head`: the reader gone, the command stops without a traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "dnnkit", "info"], stdout=write_end, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_autotune_tunes_rnn_lines_beside_the_rest(tmp_path):
    """A batch with an LSTM sequence: it is tuned like the GEMM beside it, every time-loop schedule that
    can run it timed (--no-prune), and its records name them."""
    batch = tmp_path / "layers.txt"
    batch.write_text("lstm_l2t6mb8slc16sic16_f32\nm8n8k8\n")
    r = run_in(tmp_path, "autotune", "--batch", str(batch), "--budget", "0.01", "--json", "--no-prune")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert [p["descriptor"] for p in out["problems"]] == ["lstm_l2t6mb8slc16sic16_f32", "m8n8k8_f32"]
    records = {x["algorithm"]: x for x in out["problems"][0]["records"]}
    assert {"fused", "fused_units", "fused_rows", "fused_wavefront"} <= set(records)
    assert records["fused_units"]["status"] == "ok" and records["fused_units"]["error"] < 1e-5
    assert out["summary"]["heuristic_compared"] == 2  # both have formulas: the heuristic's pick is scored
    assert all(x["predicted_s"] > 0 for x in out["problems"][0]["records"] if x["status"] == "ok")


def test_autotune_options_that_would_be_ignored(tmp_path):
    r = run_in(tmp_path, "autotune", "--problem", "m8n8k8", "--mb", "4")
    assert r.returncode == 2 and "--mb" in r.stderr
    r = run_in(tmp_path, "autotune", "--problem", "m8n8k8", "--dtype", "float64", "--budget", "0.01", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["problems"][0]["descriptor"] == "m8n8k8_f64", r.stderr


def test_autotune_workspace_limit_on_a_cached_problem(tmp_path):
    """A problem tuned without a limit, asked again under one: the choice shown is the fastest within the
    limit (as dispatch takes it under that limit), and the stored record keeps every candidate; a result
    tuned under a tighter limit is tuned again when a looser one is asked for."""
    d = "mb1ic16ih14oc16oh14kh3ph1"
    r = run_in(tmp_path, "autotune", "--problem", d, "--budget", "0.01", "--json")
    full = json.loads(r.stdout)["problems"][0]
    assert full["source"] == "measured" and any(x["workspace_bytes"] for x in full["records"] if x["status"] == "ok")
    r = run_in(tmp_path, "autotune", "--problem", d, "--budget", "0.01", "--workspace-limit", "0", "--json")
    limited = json.loads(r.stdout)["problems"][0]
    assert limited["source"] == "cache", r.stderr
    chosen = next(x for x in limited["records"] if x["algorithm"] == limited["best"])
    assert chosen["workspace_bytes"] == 0
    r = run_in(tmp_path, "autotune", "--problem", d, "--budget", "0.01", "--workspace-limit", "0")
    assert "workspace limit 0 B" in r.stdout and f"* {limited['best']}" in r.stdout, r.stdout
    # Tuned under a limit of 0 (--force), then asked with none: tuned again, every candidate timed.
    run_in(tmp_path, "autotune", "--problem", d, "--budget", "0.01", "--workspace-limit", "0", "--force")
    r = run_in(tmp_path, "autotune", "--problem", d, "--budget", "0.01", "--workspace-limit", "1G", "--json")
    again = json.loads(r.stdout)["problems"][0]
    assert again["source"] == "measured" and not any(x["status"] == "over_limit" for x in again["records"])


@pytest.mark.parametrize("name,value,expect", [
    ("DNNKIT_AMX", "off", "not dnnkit.get_amx()"), ("DNNKIT_AMX", "FALSE", "not dnnkit.get_amx()"),
    ("DNNKIT_AMX", "no", "not dnnkit.get_amx()"), ("DNNKIT_AMX", "0", "not dnnkit.get_amx()"),
    ("DNNKIT_AMX", "on", "dnnkit.get_amx() == dnnkit._cpu.amx_available()"),
    ("DNNKIT_BLOCK_CACHE_MB", "64", "True"), ("DNNKIT_ALGO_GEMM", "gemm_goto",
                                              "dnnkit._config.algo_overrides() == {'gemm': 'gemm_goto'}"),
])
def test_a_good_environment_variable_is_taken_without_a_warning(name, value, expect):
    env = dict(os.environ, **{name: value})
    r = subprocess.run([sys.executable, "-W", "error", "-c", f"import dnnkit; assert {expect}; print('ok')"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout and not r.stderr, r.stderr


def test_the_amx_switch_takes_the_usual_spellings():
    from dnnkit import _config

    for raw in ("0", "off", "OFF", "false", "No", " no "):
        assert _config._amx_switch(raw) is False
    for raw in ("1", "on", "True", "yes"):
        assert _config._amx_switch(raw) is True
    for raw in ("maybe", "2", "0x", "o"):
        with pytest.raises(ValueError, match="off"):
            _config._amx_switch(raw)


def _not_a_store(directory, what):
    """Makes directory's store one that cannot be opened or read; returns the preexec_fn that does it for a
    child (a file-size limit under which SQLite cannot create the store's shared-memory file), or None."""
    import resource

    from dnnkit.autotune import cache
    from helpers import cached_result

    path = directory / cache.FILENAME
    if what == "fifo":
        os.mkfifo(path)
    elif what == "symlink to /dev/zero":
        os.symlink("/dev/zero", path)
    else:
        s = cache.Store(path)
        s.put(cached_result())
        s.close()
        return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return None


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, /dev/zero and RLIMIT_FSIZE")
@pytest.mark.parametrize("what", ["fifo", "symlink to /dev/zero", "file-size limit"])
@pytest.mark.parametrize("command", [["cache", "list"], ["autotune", "--problem", "m4n4k4", "--budget", "0"],
                                     ["cache", "import", "{export}"]])
def test_a_store_the_command_cannot_use_is_a_one_line_error(tmp_path, what, command):
    """Where the library would warn and keep its results in memory, the command line stops with its
    one-line error (exit status 2) naming the command and the store, and leaves the file as it was."""
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"format": "dnnkit-tuning-cache", "schema": 1, "results": []}))
    store = tmp_path / "store"
    store.mkdir()
    preexec = _not_a_store(store, what)
    args = [a.replace("{export}", str(export)) for a in command]
    r = subprocess.run([sys.executable, "-m", "dnnkit", *args], capture_output=True, text=True, timeout=300,
                       env=tune_env(store), preexec_fn=preexec)
    label = " ".join(command[:2]) if command[0] == "cache" else "autotune"
    one_line_error(r, f"dnnkit: error: {label}: tuning cache", str(store / "tuning.sqlite3"))
    assert not [f for f in os.listdir(store) if ".bad-" in f]
    if what == "file-size limit":
        listed = run_in(store, "cache", "list", "--json")
        assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1, listed.stderr


def test_an_import_over_the_file_size_limit_is_a_one_line_error_and_keeps_the_store(tmp_path):
    import resource

    store = tmp_path / "store"
    assert run_in(store, "autotune", "--problem", "m8n8k8", "--budget", "0.01").returncode == 0
    export = tmp_path / "export.json"
    assert run_in(store, "cache", "export", str(export)).returncode == 0
    doc = json.loads(export.read_text())
    row = doc["results"][0]
    doc["results"] = [dict(row, problem=f"gemm m{100 + i}n8k8_f32", records=row["records"] * 20) for i in range(300)]
    export.write_text(json.dumps(doc))
    files = [store / f for f in os.listdir(store)]
    limit = max(os.path.getsize(f) for f in files) + 32768
    r = subprocess.run([sys.executable, "-m", "dnnkit", "cache", "import", str(export)], capture_output=True,
                       text=True, timeout=300, env=tune_env(store),
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY)))
    one_line_error(r, "cache import", "nothing was stored")
    assert not [f for f in os.listdir(store) if ".bad-" in f]
    listed = run_in(store, "cache", "list", "--json")
    assert listed.returncode == 0 and [x["problem"] for x in json.loads(listed.stdout)] == ["gemm m8n8k8_f32"]


def test_an_unresolvable_cache_directory_is_a_one_line_error():
    env = dict(os.environ, DNNKIT_CACHE_DIR="~dnnkit-no-such-user/x")
    for args in (["cache", "path"], ["cache", "list"], ["autotune", "--problem", "m4n4k4", "--budget", "0"]):
        r = subprocess.run([sys.executable, "-m", "dnnkit", *args], capture_output=True, text=True, timeout=120,
                           env=env)
        one_line_error(r, "DNNKIT_CACHE_DIR", "~dnnkit-no-such-user/x")


def test_export_and_import_restore_rnn_records(tmp_path):
    """An exported cache with RNN results (besides GEMM and convolution ones) imports into an empty one."""
    tuned = tmp_path / "tuned"
    r = run_in(tuned, "autotune", "--problem", "lstm_l1t2mb1slc4sic4", "--problem", "gru_l1t2mb1slc4sic4_bidir",
               "--direction", "bwd", "--budget", "0.01")
    assert r.returncode == 0, r.stderr
    batch = tmp_path / "layers.txt"
    batch.write_text("m4n4k4\nmb1ic2ih5oc2kh3\n")  # a batch's direction is its convolutions'
    r = run_in(tuned, "autotune", "--batch", str(batch), "--direction", "bwd_data", "--budget", "0.01")
    assert r.returncode == 0, r.stderr
    assert run_in(tuned, "cache", "export", str(tmp_path / "e.json")).returncode == 0
    fresh = tmp_path / "fresh"
    r = run_in(fresh, "cache", "import", str(tmp_path / "e.json"))
    assert r.returncode == 0 and "imported 4 of 4" in r.stdout, r.stdout + r.stderr
    assert json.loads(run_in(fresh, "cache", "list", "--json").stdout) == \
        json.loads(run_in(tuned, "cache", "list", "--json").stdout)
    for d in ("lstm_l1t2mb1slc4sic4", "gru_l1t2mb1slc4sic4_bidir"):
        assert run_in(fresh, "cache", "show", d, "--direction", "bwd").returncode == 0


def test_an_export_never_overwrites_a_store(tmp_path):
    """`dnnkit cache export` onto the live store (by any name), its journal files, or another SQLite
    database is refused; the store keeps its records. Over a JSON file it writes as before."""
    assert run_in(tmp_path, "autotune", "--problem", "m4n4k4", "--budget", "0.01").returncode == 0
    live = run_in(tmp_path, "cache", "path").stdout.strip()
    os.symlink(live, tmp_path / "alias.sqlite3")
    other = tmp_path / "other.db"
    shutil.copy(live, other)
    for target, words in ((live, ["live tuning cache"]), (str(tmp_path / "alias.sqlite3"), ["live tuning cache"]),
                          (live + "-wal", ["live tuning cache's wal file"]), (str(other), ["SQLite database"])):
        one_line_error(run_in(tmp_path, "cache", "export", target), "cache export", *words)
    listed = run_in(tmp_path, "cache", "list", "--json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1
    assert not [f for f in os.listdir(tmp_path) if ".bad-" in f]
    out = tmp_path / "e.json"
    out.write_text("{}")
    assert run_in(tmp_path, "cache", "export", str(out)).returncode == 0
    assert len(json.loads(out.read_text())["results"]) == 1


@pytest.mark.parametrize("descriptor", ["m1048576n1048576k1", "mb1ic1ih1oc1kh1ph1000000"])
def test_a_problem_too_large_for_memory_is_reported_not_a_traceback(tmp_path, descriptor):
    """Outputs that cannot be allocated fail every candidate (their records say so): nothing tuned is the
    command's one-line error naming the problem, exit status 2; beside a problem that was tuned, a line
    naming it and exit status 1."""
    from dnnkit.problem import parse_descriptor

    name = parse_descriptor(descriptor).descriptor()
    r = run_in(tmp_path, "autotune", "--problem", descriptor, "--budget", "0", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dnnkit: error: autotune: nothing could be tuned") and "MemoryError" in last, last
    assert name in last
    records = json.loads(r.stdout)["problems"][0]["records"]
    assert all(x["status"] in ("failed", "unsupported", "pruned") for x in records)
    r = run_in(tmp_path, "autotune", "--problem", descriptor, "--problem", "m4n4k4", "--budget", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "dnnkit: autotune: not tuned:" in r.stderr and name in r.stderr
    assert "tuned 1 of 2" in r.stdout


def test_autotune_on_the_gpu_tunes_there_or_says_why_not(tmp_path):
    """--device cuda puts a GEMM or RNN descriptor on the GPU: tuned there, or, without a usable GPU, the
    reason as a one-line error (never the CPU problem in its place)."""
    from dnnkit.backends import cuda

    r = run_in(tmp_path, "autotune", "--problem", "m4n4k4", "--device", "cuda", "--budget", "0.01", "--json")
    if cuda.status()["available"]:
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["problems"][0]["descriptor"] == "m4n4k4_f32_cuda"
    else:
        one_line_error(r, "autotune --device cuda", "GPU", cuda.status()["reason"].split(" (")[0])
    one_line_error(run_in(tmp_path, "autotune", "--problem", "mb1ic2ih5oc2kh3", "--device", "cuda"),
                   "autotune --device cuda", "no CUDA kernels for conv2d_fwd")
