"""DeepSpeed's CPU ops are not rebuilt whichever way the venv is used (zero_train.runtime.extensions).

torch runs the first `ninja` on PATH at every first load of an op, and ninja rebuilds everything when the
build log is another version's (pip's 1.13 vs a system's 1.11). So: a process of this venv started from an
activated shell (its bin first), from scripts/test.sh, or from a bare PATH without the venv resolves one and
the same ninja, the venv's, once zero_train is imported; and every op built in TORCH_EXTENSIONS_DIR is up to
date for that ninja (ninja's own dry run, in a scratch copy: the shared folder is not touched).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from zero_train.runtime.extensions import built_ops, venv_ninja, would_rebuild

pytestmark = pytest.mark.tier("slow")

RESOLVE = "import shutil, zero_train; print(shutil.which('ninja'))"


def _path_without(directory: pathlib.Path) -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if pathlib.Path(d) != directory)


def test_every_way_of_starting_this_venv_resolves_its_ninja():
    ninja = venv_ninja()
    if ninja is None:
        pytest.skip(f"no ninja in {sys.prefix}/bin (not a venv with pip's ninja)")
    bare = _path_without(ninja.parent)
    starts = {
        "activated venv, scripts/test.sh": f"{ninja.parent}{os.pathsep}{bare}",
        "bare .venv/bin/python": bare,
        "system dirs only": "/usr/bin:/bin",
    }
    for start, path in starts.items():
        env = dict(os.environ, PATH=path)
        found = subprocess.run(
            [sys.executable, "-c", RESOLVE], env=env, capture_output=True, text=True, check=True
        )
        assert pathlib.Path(found.stdout.strip()).resolve() == ninja.resolve(), start


@pytest.mark.tier("quick")
def test_deepspeed_ops_would_not_rebuild_under_the_venvs_ninja():
    ops, ninja = built_ops(), venv_ninja()
    if not ops or ninja is None:
        pytest.skip(
            "no DeepSpeed op built in TORCH_EXTENSIONS_DIR (GPU machines build theirs when first used)"
        )
    stale = {name: len(steps) for name, folder in ops.items() if (steps := would_rebuild(folder, ninja))}
    assert not stale, (
        f"build steps {ninja} would run (built by another ninja? rerun scripts/setup.sh): {stale}"
    )


def test_a_log_of_another_ninja_counts_as_a_rebuild(tmp_path):
    """The check itself: an up-to-date op whose log another ninja version wrote is reported stale."""
    ops, ninja = built_ops(), venv_ninja()
    if not ops or ninja is None:
        pytest.skip("no DeepSpeed op built in TORCH_EXTENSIONS_DIR")
    name, folder = next(iter(ops.items()))
    copy = tmp_path / name
    copy.mkdir()
    for entry in folder.iterdir():
        if entry.is_file():
            (copy / entry.name).symlink_to(entry)
    version = subprocess.run([ninja, "--version"], capture_output=True, text=True, check=True).stdout
    major, minor = (int(part) for part in version.split(".")[:2])
    # ninja 1.11 writes log v5, 1.12+ v6/v7: each discards the other's
    other = "v5" if (major, minor) >= (1, 12) else "v7"
    (copy / ".ninja_log").unlink()
    (copy / ".ninja_log").write_text(f"# ninja log {other}\n")
    assert would_rebuild(copy, ninja)
