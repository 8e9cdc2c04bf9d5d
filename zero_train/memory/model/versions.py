"""The library versions the per-phase peak model was derived from, and a warning when the installed ones differ.

The peak model's terms follow what torch's and DeepSpeed's code allocates (README.md in this folder names the
runs); another version may allocate differently. The check reads the installed versions from the package
metadata, so it imports neither torch nor DeepSpeed.
"""

from __future__ import annotations

import importlib.metadata
import warnings

DERIVED_WITH = {"torch": "2.13.0", "deepspeed": "0.19.8"}
"""Package -> the version (without a local build tag such as +cpu) the peak model's terms were measured with."""

_warned = False


def installed_version(package: str) -> str | None:
    """The installed version of `package` without its local build tag ("2.13.0+cpu" -> "2.13.0"), or None."""
    try:
        return importlib.metadata.version(package).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def version_mismatches() -> list[str]:
    """One phrase per package whose installed version is not the one the model was derived with."""
    found = []
    for package, derived in DERIVED_WITH.items():
        installed = installed_version(package)
        if installed != derived:
            found.append(f"{package} {installed or 'not installed'} (derived with {derived})")
    return found


def warn_if_versions_differ() -> None:
    """Warn once per process (UserWarning) when torch or DeepSpeed differ from the versions in DERIVED_WITH."""
    global _warned
    mismatches = version_mismatches()
    if _warned or not mismatches:
        return
    _warned = True
    warnings.warn(
        "the per-phase peak model (zero_train.memory.model) was derived with torch 2.13.0 and DeepSpeed 0.19.8; "
        f"installed: {', '.join(mismatches)}. Its terms may be off; re-check with `zero-train profile` + "
        "`zero-train report` (zero_train/memory/model/README.md)",
        stacklevel=2,
    )
