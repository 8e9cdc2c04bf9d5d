"""scripts/gpu_check.sh on a CPU-only machine (issue 25, item 5): with a fake python, nvidia-smi and launcher it
runs only valid zero-train commands, and bf16 only where the GPU has it natively."""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.tier("quick")


FAKE_PYTHON = """#!/usr/bin/env bash
case "$2" in  # the script's `python -c` probes, answered as on a node with 2 GPUs
  *is_bf16_supported*) echo "$FAKE_NATIVE_BF16" ;;
  *get_device_name*) echo "gpu 0: fake" ;;
  *device_count*) echo 2 ;;
  *) echo "unexpected python call: $*" >&2; exit 1 ;;
esac
"""
FAKE_NVIDIA_SMI = "#!/usr/bin/env bash\nprintf 'GPU 0: fake\\nGPU 1: fake\\n'\n"
RECORDER = """#!/usr/bin/env bash
{ printf '%s' "$(basename "$0")"; printf '\\x1f%s' "$@"; printf '\\n'; } >> "$FAKE_CALLS"
"""


def _gpu_check_calls(repo_root, tmp_path, native_bf16: bool) -> list[list[str]]:
    """Every launcher and zero-train command line scripts/gpu_check.sh runs, with fakes for the GPU node."""

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fakes = {
        "python": FAKE_PYTHON,
        "nvidia-smi": FAKE_NVIDIA_SMI,
        "deepspeed": RECORDER,
        "zero-train": RECORDER,
    }
    for name, text in fakes.items():
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(
        os.environ,
        PATH=f"{fake_bin}:{os.environ['PATH']}",
        ZT_PYTHON=str(fake_bin / "python"),
        ZT_GPU_CHECK_OUT=str(tmp_path / "out"),
        FAKE_CALLS=str(calls),
        FAKE_NATIVE_BF16=str(int(native_bf16)),
    )
    script = repo_root / "scripts" / "gpu_check.sh"
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.split("\x1f") for line in calls.read_text().splitlines()]


def _check_zero_train_command(argv: list[str]) -> None:
    """Parse with zero-train's own parser and apply the subcommand's checks that need no run."""
    from zero_train.cli.bench import _check_args, resolve_scenario
    from zero_train.cli.main import build_parser
    from zero_train.launch.cells import cell_config
    from zero_train.registry import engine_names

    args = build_parser(argv).parse_args(argv)
    if args.command == "profile":
        assert set(args.engines) <= set(engine_names()), args.engines
        for engine in args.engines:  # a stage/precision it refuses raises
            cell_config(engine, 2, precision=args.precision, micro_batch_size=args.micro_batch_size,
                        grad_accum=args.grad_accum)  # fmt: skip
    elif args.command == "bench":
        resolve_scenario(args)
        _check_args(args)


@pytest.mark.tier("slow")
@pytest.mark.parametrize("native_bf16", [True, False])
def test_gpu_check_runs_valid_commands_and_bf16_only_where_native(repo_root, tmp_path, native_bf16):
    """bash -n, then every command of gpu_check.sh (launcher + scripts/train.py, zero-train) through our
    parsers; zero2 and fsdp2 are profiled, the compute scenario is benched, bf16 only on native GPUs."""

    from zero_train.train.args import parse_args

    assert subprocess.run(["bash", "-n", str(repo_root / "scripts" / "gpu_check.sh")]).returncode == 0
    precisions = ["fp32", "bf16"] if native_bf16 else ["fp32"]
    calls = _gpu_check_calls(repo_root, tmp_path, native_bf16)
    assert [call[0] for call in calls] == ["deepspeed"] * 2 + ["zero-train"] * (2 * len(precisions) + 2)
    trains = [call[call.index("scripts/train.py") + 1 :] for call in calls if call[0] == "deepspeed"]
    assert [call[1:3] for call in calls if call[0] == "deepspeed"] == [["--num_gpus", "2"]] * 2
    for argv in trains:
        parse_args(argv)
    zero_train = [call[1:] for call in calls if call[0] == "zero-train"]
    for argv in zero_train:
        _check_zero_train_command(argv)
    profiles = [argv for argv in zero_train if argv[0] == "profile"]
    assert [argv[argv.index("--precision") + 1] for argv in profiles] == precisions
    for argv in profiles:
        engines = argv[argv.index("--engines") + 1].split(",")
        assert {"zero2", "fsdp2-z2", "fsdp2-z3"} <= set(engines)
    benches = [argv for argv in zero_train if argv[0] == "bench"]
    assert ["--scenario", "compute"] in [argv[1:3] for argv in benches]
    assert all(argv[argv.index("--precisions") + 1] == ",".join(precisions) for argv in benches)
    assert native_bf16 or not any("bf16" in arg for call in calls for arg in call)
