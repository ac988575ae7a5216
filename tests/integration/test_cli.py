"""The ``pipeflow`` command as a user meets it, every case through a subprocess."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeflow._cli._measure import RunResult

from ._terminal import has_bar, pipeflow_cli, screen_lines

ROOT = Path(__file__).resolve().parents[2]


def pipeflow(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
             **kwargs) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeflow.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, **kwargs)


def test_version():
    import pipeflow as pf

    out = pipeflow("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"pipeflow {pf.__version__}"


@pytest.mark.parametrize("args", [["--help"], ["--version"], []])
def test_help_and_version_import_neither_torch_nor_numpy(args):
    code = ("import sys\nfrom pipeflow.cli import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('torch', 'numpy', 'boto3', 'PIL') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "LOADED []" in out.stdout
    for command in ("demo", "run", "recipes", "make-data", "serve", "cache"):
        if args == ["--help"]:
            assert command in out.stdout


@pytest.mark.parametrize("args", [["recipes"], ["recipes", "wds-boto3"], ["recipes", "wds-bot03"]])
def test_looking_up_recipes_imports_no_torch(args):
    # a typo must be answered at once, not after importing torch (seconds on a cold start)
    code = ("import sys\nfrom pipeflow.cli import main\n"
            f"code = main({args!r})\n"
            "print('LOADED', code, sorted(m for m in ('torch', 'numpy', 'boto3') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert f"LOADED {2 if args[-1] == 'wds-bot03' else 0} []" in out.stdout, out.stdout + out.stderr
    if args[-1] == "wds-bot03":
        assert "did you mean 'wds-boto3'" in out.stderr


def test_a_misspelled_command_is_one_line_with_the_nearest():
    out = pipeflow("recipe", "wds-boto3")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    from pipeflow.cli import COMMANDS

    assert out.stderr.strip() == (f"pipeflow: no command 'recipe'; did you mean 'recipes'? commands: "
                                  f"{', '.join(COMMANDS)}")


def test_serve_on_a_busy_port_says_why():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = pipeflow("serve", "--port", str(port), timeout=60)
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "export" not in out.stdout and "Traceback" not in out.stderr


def test_serve_refuses_an_impossible_port():
    out = pipeflow("serve", "--port", "70000")
    assert out.returncode == 2 and "between 1 and 65535" in out.stderr


@pytest.mark.parametrize("bucket", ["t", "Upper", "under_score", "1.2.3.4", "a..b", "-dash"])
def test_serve_refuses_an_invalid_bucket_name_before_starting(bucket):
    out = pipeflow("serve", "--bucket", "good-name", f"--bucket={bucket}", timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]  # one line
    assert f"invalid bucket name {bucket!r}" in out.stderr
    assert "export" not in out.stdout and "Traceback" not in out.stderr


@pytest.mark.parametrize("name", ["abc", "my-bucket.v2", "a" * 63, "t123-4-abcdef12"])
def test_valid_bucket_names_pass(name):
    from pipeflow.backends.base import bucket_name_problem

    assert bucket_name_problem(name) is None


@pytest.mark.parametrize("args", [("index", "s3://my..bucket/x/", "-o", "{tmp}/index"),
                                  ("convert", "s3://my..bucket/x/", "{tmp}/out"),
                                  ("upload", "{tmp}", "s3://my..bucket/x/"),
                                  ("run", "wds-boto3", "--url", "s3://my..bucket/x/")])
def test_an_invalid_bucket_name_is_one_line_before_any_request(tmp_path, args):
    """Nothing listens at the endpoint: a request would fail as unreachable, not as the name."""
    (tmp_path / "a.bin").write_bytes(b"abc")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = pipeflow(*(arg.format(tmp=tmp_path) for arg in args),
                   env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
    assert "invalid bucket name 'my..bucket'" in out.stderr


@pytest.mark.s3
def test_a_mistyped_legacy_style_bucket_name_is_named_when_not_found(s3, tmp_path):
    out = pipeflow("index", "s3://My_Bucket/x/", "-o", str(tmp_path / "index"), env=s3.env())
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "not a valid bucket name" in out.stderr and "'My_Bucket'" in out.stderr, out.stderr


@pytest.mark.s3
def test_make_data_to_a_missing_bucket_is_one_line(s3):
    out = pipeflow("make-data", "jpeg", "s3://no-such-bucket-here/x", "--count", "2", "--image-size", "8",
                   "--quiet", env=s3.env())
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "'no-such-bucket-here' does not exist" in lines[0] and "--create-bucket" in lines[0]
    # nothing was written, and --create-bucket then works
    ok = pipeflow("make-data", "jpeg", "s3://no-such-bucket-here/x", "--count", "2", "--image-size", "8",
                  "--quiet", "--create-bucket", env=s3.env())
    assert ok.returncode == 0, ok.stderr
    assert "wrote 2 samples" in ok.stdout


def test_make_data_to_an_unreachable_endpoint_is_one_line():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends: nothing listens there
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    # no retry settings: an endpoint that never answered is reported within seconds anyway
    out = pipeflow("make-data", "jpeg", "s3://bucket/x", "--count", "1", "--quiet", env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cannot reach the S3 endpoint" in out.stderr


def test_recipes_table_fits_100_columns_and_lists_every_recipe():
    from pipeflow.recipes import names

    out = pipeflow("recipes", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= 100
    for name in names():
        assert f"\n{name} " in out.stdout


def test_recipes_name_shows_options_with_defaults():
    out = pipeflow("recipes", "mountpoint-cache")
    assert out.returncode == 0, out.stderr
    assert "max_bytes" in out.stdout and "cache_dir" in out.stdout and "workers" in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 100
    wrong = pipeflow("recipes", "mountpoint-cach")
    assert wrong.returncode == 2 and "did you mean 'mountpoint-cache'" in wrong.stderr


def test_recipes_json_has_real_values():
    out = pipeflow("recipes", "--json")
    assert out.returncode == 0, out.stderr
    by_name = {r["name"]: r for r in json.loads(out.stdout)}
    cache = by_name["mountpoint-cache"]["options"]
    assert cache["workers"] == 16 and cache["preprocess"] is False and cache["cache_dir"] is None
    one = json.loads(pipeflow("recipes", "single-boto3", "--json").stdout)
    assert one["options"] == {"method": "download_fileobj", "workers": 0}


def test_recipes_into_a_closed_pipe_ends_quietly():
    reader = subprocess.Popen(["head", "-n", "2"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    proc = subprocess.Popen([sys.executable, "-m", "pipeflow.cli", "recipes"], stdout=reader.stdin,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    reader.stdin.close()
    _, err = proc.communicate(timeout=60)
    reader.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert proc.returncode in (0, 141)


@pytest.mark.parametrize("intervals, mean, variance", [
    ([9.0], None, None),
    ([9.0, 1.0], 1.0, None),
    ([9.0, 1.0, 3.0], 2.0, 2.0),
    ([100.0, 2.0, 2.0, 2.0], 2.0, 0.0),
])
def test_run_statistics_exclude_the_first_interval(intervals, mean, variance):
    result = RunResult(interval_times=intervals)
    assert result.mean == mean
    assert result.variance == variance


def test_run_prints_statistics_without_the_first_interval(tmp_path):
    data = tmp_path / "data"
    made = pipeflow("make-data", "single", str(data), "--count", "12", "--image-size", "8", "--quiet")
    assert made.returncode == 0, made.stderr
    out = pipeflow("run", "single-ffm", "--url", str(data), "--batch-size", "1", "--report-every", "4")
    assert out.returncode == 0, out.stderr
    times = [float(line.split()[-1]) for line in out.stdout.splitlines() if line.startswith("Iteration")]
    assert len(times) == 3
    summary = next(line for line in out.stdout.splitlines() if line.startswith("mean"))
    shown_mean = float(summary.split()[1])
    # the printed times are rounded to 4 places; the mean is of the last two only
    assert shown_mean == pytest.approx((times[1] + times[2]) / 2, abs=2e-4)
    assert "first interval excluded" in summary


def test_run_profile_prints_the_verdict_and_draws_a_png(tmp_path):
    data = tmp_path / "data"
    made = pipeflow("make-data", "single", str(data), "--count", "12", "--image-size", "8", "--quiet")
    assert made.returncode == 0, made.stderr
    png = tmp_path / "profile.png"
    out = pipeflow("run", "single-ffm", "--url", str(data), "--batch-size", "2", "--profile", str(png))
    assert out.returncode == 0, out.stderr
    assert "bottleneck: " in out.stdout and "advice: " in out.stdout
    table = out.stdout[out.stdout.index("stage "):]
    assert "items" in table.splitlines()[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- progress bars: drawn on stderr when stdout is a terminal, never into a pipe or with --quiet ----
BAR_MODES = [pytest.param(True, False, True, id="terminal"), pytest.param(False, False, False, id="pipe"),
             pytest.param(True, True, False, id="terminal-quiet")]
#: the bar follows stderr, where it is drawn: `... | tail` draws it, `... 2>log` does not
STREAM_MODES = [pytest.param("stderr", True, id="stdout-piped"),
                pytest.param("stdout", False, id="stderr-logged")]


@pytest.mark.parametrize("terminal, drawn", STREAM_MODES)
def test_run_bar_goes_where_stderr_is_a_terminal(tmp_path, terminal, drawn):
    data = tmp_path / "data"
    made = pipeflow("make-data", "single", str(data), "--count", "12", "--image-size", "8", "--quiet")
    assert made.returncode == 0, made.stderr
    code, out, err = pipeflow_cli("run", "single-ffm", "--url", str(data), "--batch-size", "2",
                                  "--steps", "5", terminal=terminal)
    assert code == 0, err
    assert has_bar(err, "run single-ffm") is drawn, err
    assert ("\r" in err) is drawn
    # with --steps the bar knows its total: 5 steps x 2 samples, so it shows an ETA
    assert (re.search(r"\d+/10 \[", err) is not None) is drawn, err


@pytest.mark.parametrize("columns", [160, 0])
@pytest.mark.parametrize("terminal, drawn, lines", [
    pytest.param(True, True, False, id="terminal"), pytest.param(False, False, True, id="pipe")])
def test_convert_draws_a_bar_on_a_terminal_and_plain_lines_into_a_pipe(tmp_path, columns, terminal,
                                                                      drawn, lines):
    if columns == 0 and not terminal:
        pytest.skip("a pipe has no size")
    data = tmp_path / "data"
    made = pipeflow("make-data", "jpeg", str(data), "--count", "12", "--image-size", "8", "--quiet")
    assert made.returncode == 0, made.stderr
    code, out, err = pipeflow_cli("convert", str(data), str(tmp_path / "shards"), "--max-count", "4",
                                  terminal=terminal, columns=columns)
    assert code == 0, err
    # a bar redraws its line (a terminal of no size still gets one); a pipe gets lines
    assert (f"\r{data} -> " in err) is drawn, err
    assert ("\r" in err) is drawn, err
    # the bar's total is the listing's samples (12 keys of 24 objects): it shows an ETA (on a
    # terminal wide enough for the long paths of the description to leave room for it)
    if columns:
        assert (re.search(r"\d+/12 \[", err) is not None) is drawn, err
    if lines:
        assert err.strip().splitlines()[-1].endswith("samples/s")
    assert "wrote 12 samples from 24 objects as 3 tar shards" in out


@pytest.mark.parametrize("terminal", [True, False])
def test_make_data_bar_is_not_repeated_and_its_bytes_are_the_bytes_written(tmp_path, terminal):
    # tiny images: the tar headers are most of the bytes written (0.1 MB of shards, 0.0 MB of samples)
    code, out, err = pipeflow_cli("make-data", "wds", str(tmp_path / "d"), "--count", "24", "--image-size",
                                  "8", "--shard-mb", "0.01", terminal=terminal)
    assert code == 0, err
    written = re.search(r"as \d+ objects?, ([0-9.]+ MB),", out)
    assert written, out
    if terminal:  # the finished bar stays; no summary line is printed under it
        assert has_bar(err, "wds -> ") and " MB" not in err, err
    else:  # one line at the end, with the bytes of the shards (not of the samples in them)
        assert err.strip().splitlines() == [err.strip()] and f"24/24 {written.group(1)}" in err, err


@pytest.mark.parametrize("recipe, layout, says", [
    ("single-ffm", "wds", "no objects matching '*.image' among the 1 object listed"),
    ("tfrecord-ffm", "single", "no objects matching '*.tfrecord' among the 8 objects listed"),
    ("wds-ffm", "jpeg-shards", "sample lacks required field"),
])
def test_run_on_data_of_another_layout_is_one_typed_line(tmp_path, recipe, layout, says):
    """It used to run an epoch of 0 samples (exit 0), or end in a KeyError traceback."""
    data = tmp_path / "data"
    made = pipeflow("make-data", layout, str(data), "--count", "4", "--image-size", "8", "--quiet",
                    "--shard-mb", "0.002")
    assert made.returncode == 0, made.stderr
    out = pipeflow("run", recipe, "--url", str(data), "--steps", "2", "--quiet")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("pipeflow run: ") and says in out.stderr, out.stderr


@pytest.mark.parametrize("terminal, quiet, drawn", BAR_MODES)
def test_run_progress_bar(tmp_path, terminal, quiet, drawn):
    data = tmp_path / "data"
    made = pipeflow("make-data", "single", str(data), "--count", "12", "--image-size", "8", "--quiet")
    assert made.returncode == 0, made.stderr
    code, out, err = pipeflow_cli("run", "single-ffm", "--url", str(data), "--batch-size", "2",
                                  *(["--quiet"] if quiet else []), terminal=terminal)
    assert code == 0, err
    assert has_bar(err, "run single-ffm") is drawn, err
    assert "run single-ffm" not in out  # the bar never goes to stdout
    assert "6 steps, 12 samples" in out


def test_run_prints_warnings_on_lines_of_their_own_above_the_bar(tmp_path):
    # one shard for 3 DataLoader workers: torch warns (in this process) about 3 workers on 2
    # cores, and pipeflow (in a worker) that 2 of them read nothing; neither may end up glued
    # to the end of the bar's line, where a bar leaves the cursor
    data = tmp_path / "data"
    made = pipeflow("make-data", "wds", str(data), "--count", "40", "--image-size", "8", "--quiet")
    assert made.returncode == 0, made.stderr
    env = {"PYTHONWARNINGS": "default"}
    code, out, err = pipeflow_cli("run", "wds-ffm", "--url", str(data), "--num-workers", "3",
                                  "--epochs", "2", terminal="stderr", env=env)
    assert code == 0, err
    assert has_bar(err, "run wds-ffm"), err
    lines = screen_lines(err)
    idle = [line for line in lines if "2 of them read nothing" in line]
    assert len(idle) == 1 and idle[0].startswith("pipeflow: shard_by_rank: "), lines
    torch_warning = [line for line in lines if "UserWarning: This DataLoader will create 3" in line]
    assert torch_warning and all(line.startswith(("/", "<")) for line in torch_warning), lines


@pytest.mark.s3
@pytest.mark.parametrize("terminal, quiet, drawn", BAR_MODES)
def test_bench_progress_bar_names_the_scenario_and_case(tmp_path, terminal, quiet, drawn):
    # scenario 4 when the bar is drawn (it has cases to name), the shorter scenario 5 otherwise;
    # pipeflow's cases only (two in S4), so no side venv is asked for
    scenario = "s4" if drawn else "s5"
    code, out, err = pipeflow_cli("bench", "--tiny", "--scenarios", scenario, "--only", "pipeflow",
                                  "--no-datapipes", "--no-streaming-peers", "--latency-ms", "0",
                                  "--out", str(tmp_path / "out"),
                                  "--workdir", str(tmp_path / "work"), *(["--quiet"] if quiet else []),
                                  terminal=terminal)
    assert code == 0, err
    assert has_bar(err, "bench") is drawn, err
    assert f"== scenario {scenario[1:]}" in out
    if drawn:
        assert "bench s4, case 1: pipeflow (JPEG, thread workers)" in err
        assert "1/1 [" in err  # the scenario count reached its total


def test_serve_examples_holds_what_the_docs_examples_read():
    """`pipeflow serve --examples`: the README's example runs against it as written."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "pipeflow.cli", "serve", "--examples"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        lines = []
        while not lines or not lines[-1].startswith("# press Ctrl-C"):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            lines.append(line.strip())
        exported = dict(line[len("export "):].split("=", 1) for line in lines if line.startswith("export "))
        assert "# the docs' examples read: s3://bucket/ s3://my-bucket/" in lines
        code = ("import pipeflow as pf\n"
                "pipe = (pf.list_objects('s3://bucket/train/', pattern='*.tar').open().untar()"
                ".group_pairs(required=('image.png', 'label.cls')).decode('torch').batch(4))\n"
                "print(sum(len(b) for b in pipe))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, **exported, "PYTHONPATH": str(ROOT)})
        assert out.stdout.strip() == "200", out.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "# stopped" in rest


@pytest.mark.parametrize(("args", "wrong", "hint"), [
    (["make-data", "wds", "s3://b/p/"], ["--samples", "3"], None),
    (["make-data", "wds", "s3://b/p/"], ["--seeds=3"], "(did you mean --seed?)"),
    (["run", "wds-boto3", "--url", "s3://b/p/"], ["--workerz", "2"], "(did you mean --num-workers?)"),
    # a prefix of a flag is refused, not taken for the flag (argparse's default, which would start
    # a run); no valid value here, so a regression fails at once instead of starting the benchmark
    (["bench"], ["--scenario", "s9"], "(did you mean --scenarios?)"),
    (["bench"], ["--shard=x"], "(did you mean --shard-mb?)"),
])
def test_a_subcommands_wrong_flag_shows_that_subcommands_usage(args, wrong, hint, capsys):
    from pipeflow.cli import main

    with pytest.raises(SystemExit) as info:
        main([*args, *wrong])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"usage: pipeflow {args[0]} "), err  # not the top-level usage
    assert f"pipeflow {args[0]}: error: unrecognized arguments: {' '.join(wrong)}" in err, err
    assert ("did you mean" not in err) if hint is None else err.rstrip().endswith(hint), err


@pytest.mark.parametrize("args, flag, says", [
    (["run", "wds-boto3", "--url", "s3://b/p/", "--batch-size", "0"], "--batch-size",
     "must be a positive integer, got 0"),
    (["run", "wds-boto3", "--url", "s3://b/p/", "--num-workers", "-1"], "--num-workers",
     "must be 0 or more, got -1"),
    (["run", "wds-boto3", "--url", "s3://b/p/", "--report-every", "0"], "--report-every",
     "must be a positive integer, got 0"),
    (["run", "wds-boto3", "--url", "s3://b/p/", "--steps", "-2"], "--steps",
     "must be a positive integer, got -2"),
    (["run", "wds-boto3", "--url", "s3://b/p/", "--epochs", "0"], "--epochs",
     "must be a positive integer, got 0"),
    (["demo", "--image-size", "0"], "--image-size", "must be a positive integer, got 0"),
    (["demo", "--batch-size", "-4"], "--batch-size", "must be a positive integer, got -4"),
    (["demo", "--timeout", "0"], "--timeout", "must be a finite number more than 0, got 0"),
    (["make-data", "jpeg", "s3://b/p/", "--image-size", "0"], "--image-size",
     "must be a positive integer, got 0"),
])
def test_a_numeric_option_out_of_range_is_refused_before_anything_runs(args, flag, says, capsys):
    # these reached torch (batch size, workers) or a modulo (report interval) as a traceback,
    # ran one step for --steps -2, or took an image size of 0 for the default
    from pipeflow.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"usage: pipeflow {args[0]} "), err
    assert err.rstrip().endswith(f"pipeflow {args[0]}: error: argument {flag}: {says}"), err


@pytest.mark.parametrize("args, flag, says", [
    # --max-size -5 or 0 wrote one sample a shard without a word, nan ended in a traceback
    (["convert", "/nonexistent/raw", "/nonexistent/shards", "--max-size", "-5"], "--max-size",
     "must be a finite number more than 0, got -5"),
    (["convert", "/nonexistent/raw", "/nonexistent/shards", "--max-size", "nan"], "--max-size",
     "must be a finite number more than 0, got nan"),
    (["make-data", "wds", "s3://b/p/", "--shard-mb", "nan"], "--shard-mb",
     "must be a finite number more than 0, got nan"),
])
def test_a_size_in_mb_out_of_range_is_refused_before_anything_runs(args, flag, says, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing sent anywhere, even if it ran
    test_a_numeric_option_out_of_range_is_refused_before_anything_runs(args, flag, says, capsys)


def test_run_with_workers_on_data_of_another_layout_says_it_in_a_few_lines(tmp_path, capsys):
    import io
    import tarfile

    from pipeflow.cli import main

    for shard in range(2):
        with tarfile.open(tmp_path / f"shard-{shard}.tar", "w") as tar:
            for i in range(4):
                for name, data in ((f"{shard}{i:03d}.image.png", b"x"), (f"{shard}{i:03d}.label.cls", b"1")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    code = main(["run", "wds-ffm", "--url", str(tmp_path), "--num-workers", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
    assert err.startswith("pipeflow run: this recipe reads samples with the fields image, label"), err
    assert "(in DataLoader worker process" in err
