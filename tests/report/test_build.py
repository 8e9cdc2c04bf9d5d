"""`zero-train report`'s refusals (report/build.py): no directory, no records, corrupt or off-schema records, an
unwritable --out exit 2 with one `error:` line and leave no output behind; a profile of failed cells only
still makes a report. The report on a real profile: tests/report/test_report.py."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from zero_train.memory.record import error_record, write_record

pytestmark = pytest.mark.tier("quick")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def report_cli(cli_main):
    """`zero-train report ARGV` in this process (tests/conftest.py's cli_main)."""
    return lambda *argv: cli_main("report", *argv)


def assert_usage_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def failed_profile(directory: pathlib.Path) -> pathlib.Path:
    """A profile directory holding one valid record: a failed cell (no ranks needed)."""
    record = error_record("exit code 1: boom", engine="ddp", zero_stage=0, model="tiny", num_params=640768,
                          precision="fp32", world_size=2)  # fmt: skip
    write_record(record, directory / "cells" / "ddp-w2-fp32.json")
    return directory


def test_missing_directory(tmp_path, report_cli):
    proc = report_cli(str(tmp_path / "nowhere"))
    assert_usage_error(proc, "is not a directory of run records")
    assert not (tmp_path / "nowhere").exists()


def test_a_json_file_that_is_no_report_summary(tmp_path, report_cli):
    (tmp_path / "summary.json").write_text('{"schema": "zero_train.run_record/1"}')
    proc = report_cli(str(tmp_path / "summary.json"))
    assert_usage_error(proc, "is not a report's summary.json")
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    older = {"schema": "zero_train.report_summary/1", "source": "runs/x", "cells": [{"cell": "ddp-w1-fp32"}]}
    (tmp_path / "summary.json").write_text(json.dumps(older))
    proc = report_cli(str(tmp_path / "summary.json"))
    assert_usage_error(proc, "was written by an older `zero-train report` (its cells lack allocator_bytes")
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_directory_without_records(tmp_path, report_cli):
    proc = report_cli(str(tmp_path))
    assert_usage_error(proc, "no run records")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content, fragment",
    [("{not json", "is unreadable or not JSON"), ('{"schema": "something else"}', "missing key 'engine'")],
)
def test_corrupt_or_off_schema_record(tmp_path, content, fragment, report_cli):
    failed_profile(tmp_path)
    (tmp_path / "cells" / "zz-broken.json").write_text(content)
    proc = report_cli(str(tmp_path))
    assert_usage_error(proc, fragment)
    assert not (tmp_path / "report").exists()


def test_unwritable_out(tmp_path, report_cli):
    failed_profile(tmp_path / "profile")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = report_cli(str(tmp_path / "profile"), "--out", str(blocker / "report"))
    assert_usage_error(proc, "cannot be created")
    assert blocker.read_text() == "not a directory"
    proc = report_cli(str(tmp_path / "profile"), "--out", str(blocker))
    assert_usage_error(proc, "is a file")
    proc = report_cli(str(tmp_path / "profile"), "--out", "/proc/zero-train-report")
    assert_usage_error(proc, "is not writable")
    proc = report_cli(str(tmp_path / "profile"), "--out", str(tmp_path))
    assert_usage_error(proc, "would contain the run records")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "profile"]
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == ["cells"]


def test_only_failed_cells_still_make_a_report(tmp_path, report_cli):
    failed_profile(tmp_path)
    proc = report_cli(str(tmp_path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["cells"] == [] and summary["failed"][0]["error"] == "exit code 1: boom"
    assert "| ddp-w2-fp32 | exit code 1: boom |" in (tmp_path / "out" / "report.md").read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cells.json", "report.md", "summary.json"]
    assert json.loads((tmp_path / "out" / "cells.json").read_text())["failed"] == summary["failed"]


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    from zero_train.report import build, plots

    def broken_plots(rows, out):
        (out / "half.png").write_bytes(PNG_MAGIC)
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(plots, "write_plots", broken_plots)
    failed_profile(tmp_path / "profile")
    with pytest.raises(RuntimeError, match="plotting failed"):
        build.write_report(tmp_path / "profile", tmp_path / "new" / "report")
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="plotting failed"):
        build.write_report(tmp_path / "profile", tmp_path / "kept")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["notes.txt"]
