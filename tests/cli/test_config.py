"""`zero-train config --help`'s examples run as printed, in the order printed (each one a file the next reads)."""

from __future__ import annotations

import shlex

import pytest

pytestmark = pytest.mark.tier("quick")


def _examples(text: str) -> list[list[str]]:
    """The `zero-train config ...` command lines of a help text, continuation lines joined, comments dropped."""
    joined = text.replace("\\\n", " ")
    return [
        shlex.split(line.split("#")[0])[1:]
        for line in joined.splitlines()
        if line.strip().startswith("zero-train config")
    ]


def test_every_example_of_the_help_runs_as_printed(tmp_path, monkeypatch, capsys):
    from zero_train.cli import config as config_cli
    from zero_train.cli.main import main

    monkeypatch.chdir(tmp_path)
    examples = _examples(config_cli.__doc__)
    assert len(examples) == 6
    for argv in examples:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0, (argv, capsys.readouterr().err)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["accel.json", "accel.yaml", "ds.json"]
