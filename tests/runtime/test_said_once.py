"""zero_train.runtime.errors.error_line under a launch's SAID_ENV folder: a line is said once across processes.

Ranks of `zero-train train --nproc-per-node N` (zero_train.launch.ranks sets the folder) each find the same bad
dataset line; the launch prints it once. tests/launch/test_ranks.py checks it end to end on 2 ranks.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from zero_train.runtime import errors

pytestmark = pytest.mark.tier("quick")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_line_is_said_once_per_folder_and_a_different_line_still_is(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(errors.SAID_ENV, str(tmp_path))
    errors.error_line("dataset line 2: not JSON")
    errors.error_line("dataset line 2: not JSON")
    errors.error_line("rank 1 was ended by SIGKILL")
    assert capsys.readouterr().err.splitlines() == [
        "error: dataset line 2: not JSON",
        "error: rank 1 was ended by SIGKILL",
    ]


@pytest.mark.tier("slow")
def test_another_process_does_not_say_it_again_and_without_the_folder_every_process_does(tmp_path):
    say = "from zero_train.runtime.errors import error_line; error_line('bad key: optimzer')"
    said = []
    for env in ({errors.SAID_ENV: str(tmp_path)}, {errors.SAID_ENV: str(tmp_path)}, {}, {}):
        env["PYTHONPATH"] = str(ROOT)
        done = subprocess.run(
            [sys.executable, "-c", say], env=env, capture_output=True, text=True, check=True
        )
        said.append(done.stderr)
    assert said == [
        "error: bad key: optimzer\n",
        "",
        "error: bad key: optimzer\n",
        "error: bad key: optimzer\n",
    ]


def test_a_folder_that_cannot_be_written_never_silences_a_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(errors.SAID_ENV, str(tmp_path / "gone"))
    errors.error_line("no such folder")
    assert capsys.readouterr().err == "error: no such folder\n"
