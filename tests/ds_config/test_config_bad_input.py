"""Bad input to `zero-train config` / `config check`: one `error:` line naming the problem and the fix,
exit code 2, no traceback, and no output file left behind."""

from __future__ import annotations

import pytest

from zero_train.cli.main import main

pytestmark = pytest.mark.tier("quick")

OUT = "OUT"  # replaced by a path inside tmp_path

# (argv after "zero-train config", words the single error line must contain)
GENERATE_CASES = [
    (["--stage", "4"], "invalid choice: 4"),
    (["--stage", "two"], "--stage"),
    (["--micro-batch-size", "0"], "expected a whole number >= 1, got 0"),
    (["--micro-batch-size", "-2"], "--micro-batch-size"),
    (["--grad-accum", "0"], "--grad-accum"),
    (["--world-size", "0"], "--world-size"),
    (
        ["--micro-batch-size", "4", "--grad-accum", "2", "--world-size", "8", "--global-batch-size", "60"],
        "--global-batch-size 60 != --micro-batch-size 4 * --grad-accum 2 * --world-size 8 = 64",
    ),
    (["--micro-batch-size", "4", "--global-batch-size", "30"], "not a multiple of --micro-batch-size 4"),
    (["--stage", "2", "--offload-param", "cpu"], "--offload-param cpu needs --stage 3"),
    (["--precision", "fp8"], "invalid choice: 'fp8'"),
    (["--stage", "3", "--offload-optimizer", "nvme"], "needs --nvme-path"),
    (["--stage", "2", "--offload-optimizer", "nvme", "--nvme-path", "/nvme"], "nvme needs --stage 3"),
    (["--nvme-path", "/nvme"], "--nvme-path is only used with"),
    (["--stage", "0", "--offload-optimizer", "cpu"], "needs --stage 1, 2 or 3"),
    (["--stage", "2", "--prefetch-bucket-size", "100"], "--prefetch-bucket-size is a ZeRO-3 setting"),
    (["--stage", "3", "--allgather-bucket-size", "100"], "not used by ZeRO-3"),
    (["--stage", "0", "--reduce-bucket-size", "100"], "no effect at --stage 0"),
    (["--lr", "0"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--betas", "0.9"], "two numbers"),
    (["--precision", "bf16", "--initial-scale-power", "10"], "only applies to --precision fp16"),
    (["--momentum", "0.9"], "--momentum is an SGD setting"),
    (["--optimizer", "sgd", "--betas", "0.9,0.99"], "Adam settings"),
    (["--scheduler", "warmup_linear"], "give --max-steps"),
    (["--warmup-steps", "50", "--max-steps", "10"], "--warmup-steps 50 exceeds --max-steps 10"),
    (["--optimizer", "sgd", "--stage", "2", "--offload-optimizer", "cpu"], "DeepSpeedCPUAdam"),
    (["--reduce-bucket-size", "0"], "--reduce-bucket-size"),
    (["--grad-clip", "-1"], "--grad-clip"),
    (["--stagee", "3"], "unrecognized arguments: --stagee"),
    (["--min-lr-ratio", "0.1", "--max-steps", "10"], "--min-lr-ratio is the cosine floor"),
    (["--model", "no-such-model-preset"], "no-such-model-preset"),
]


def run_cli(argv: list[str], capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, captured.err
    assert captured.out == ""
    return errors[0]


@pytest.mark.parametrize("argv,words", GENERATE_CASES, ids=[" ".join(a) for a, _ in GENERATE_CASES])
def test_bad_generate_flags(argv, words, tmp_path, capsys):
    out = tmp_path / "ds.json"
    line = run_cli(["config", *argv, "-o", str(out)], capsys)
    assert words in line, line
    assert list(tmp_path.iterdir()) == []  # no file, not even a temporary one


def test_unwritable_output_directory(tmp_path, capsys):
    line = run_cli(["config", "-o", str(tmp_path / "missing" / "ds.json")], capsys)
    assert "output directory" in line and "does not exist" in line
    assert list(tmp_path.iterdir()) == []


def _bad_files(tmp_path):
    (tmp_path / "syntax.json").write_text('{"train_batch_size": 8,}')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "dir.json").mkdir()
    return [
        (["config", "check", str(tmp_path / "missing.json")], "does not exist"),
        (["config", "check", str(tmp_path / "syntax.json")], "is not valid JSON (line 1"),
        (["config", "check", str(tmp_path / "list.json")], "holds a JSON list, not an object"),
        (["config", "check", str(tmp_path / "binary.json")], "cannot read config file"),
        (["config", "check", str(tmp_path / "dir.json")], "is a directory"),
        (["config", "check", str(tmp_path / "syntax.json"), "--world-size", "0"], "--world-size"),
        (["config", "check"], "takes exactly one FILE"),
        (
            ["config", "check", str(tmp_path / "list.json"), "--stage", "3"],
            "--stage does not apply to `config check`",
        ),
        (["config", "chek", "x.json"], "unknown config action 'chek'"),
    ]


def test_bad_check_input(tmp_path, capsys):
    cases = _bad_files(tmp_path)
    for argv, words in cases:
        line = run_cli(argv, capsys)
        assert words in line, (argv, line)
    assert len(GENERATE_CASES) + 1 + len(cases) >= 20
