"""`pip install .` (a wheel, not editable) runs `zero-train profile` from a directory outside the checkout.

The entry point lives in the package (`python -m zero_train.train`): profile launches it by module, with no
path into a checkout. The fresh venv borrows this venv's installed dependencies (a .pth line naming its
site-packages: no download) but not its editable zero_train, whose finder only a site directory's .pth files
would install; the dependencies' launcher scripts (torchrun) are written as pip writes console scripts.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import venv

import pytest

pytestmark = pytest.mark.tier("slow")

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCHER_SCRIPT = "#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def _fresh_venv(root: pathlib.Path) -> pathlib.Path:
    """A venv without pip that sees this venv's site-packages as a plain path (no .pth of it runs)."""
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    (pathlib.Path(site) / "shared_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    torchrun = env_dir / "bin" / "torchrun"
    torchrun.write_text(LAUNCHER_SCRIPT.format(python=python))
    torchrun.chmod(0o755)
    return env_dir


def test_an_installed_wheel_profiles_from_outside_the_checkout(tmp_path):
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ and *.egg-info there
    files = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO).stdout.split()
    for name in files:
        if name.startswith(("zero_train/", "pyproject.toml", "README.md")) and (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    env_dir = _fresh_venv(tmp_path)
    pip = [sys.executable, "-m", "pip", "--python", env_dir / "bin" / "python"]
    _run([*pip, "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet", source])
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    where = _run([env_dir / "bin" / "python", "-c", "import zero_train; print(zero_train.__file__)"], cwd=work,
                 env=env).stdout  # fmt: skip
    assert where.startswith(str(env_dir)), where  # the wheel's copy, not the checkout's
    proc = _run([env_dir / "bin" / "zero-train", "profile", "--model", "tiny", "--world-sizes", "1", "--engines",
                 "ddp", "--steps", "2", "--block-size", "32", "--launcher", "torchrun", "--out", "out"],
                cwd=work, env=env, timeout=300)  # fmt: skip
    record = json.loads((work / "out" / "cells" / "ddp-w1-fp32.json").read_text())
    assert record["error"] is None and record["engine"] == "ddp" and record["steps"] == 2, proc.stdout
    log = (work / "out" / "logs" / "ddp-w1-fp32.log").read_text()
    assert "-m zero_train.train" in log.splitlines()[0] and str(REPO) not in log
