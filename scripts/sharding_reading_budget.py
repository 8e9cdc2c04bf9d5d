"""Lines a reader opens to read each ZeRO stage of zero_train/sharding/, from its class down to torch.

    python scripts/sharding_reading_budget.py            # this checkout
    python scripts/sharding_reading_budget.py ROOT       # another checkout's zero_train/ under ROOT
    python scripts/sharding_reading_budget.py --code     # also: each module's lines of code (no prose)

Follows the imports (`from zero_train.sharding... import`) from the stage's module, within sharding/, counts
every module reached once, and leaves out sharding/comm/ (the collectives: read apart). ZeRO-2 and ZeRO-3
count only the lines not already read for the stages before them (issue 38's reading budget, BUDGETS;
tests/sharding/test_reading_budget.py holds it).
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

STAGES = {
    "zero1": ("zero_train/sharding/zero12/zero1.py", "zero_train/sharding/zero1.py"),
    "zero2": ("zero_train/sharding/zero12/zero2.py", "zero_train/sharding/zero2.py"),
    "zero3": ("zero_train/sharding/zero3/optim.py", "zero_train/sharding/zero3_optim.py"),
}
BUDGETS = {"zero1": 900, "zero2": 300, "zero3": 1100}
"""Issue 38's budget: ZeRO-1 at most 900 lines, ZeRO-2 at most 300 more, ZeRO-3 at most 1,100 more."""
IMPORT = re.compile(r"^\s*from (zero_train\.sharding[\w.]*) import ([\w, ()]+)", re.M)
COMM = (
    "zero_train/sharding/comm/",
    "zero_train/sharding/collectives.py",
    "zero_train/sharding/overlap.py",
    "zero_train/sharding/gather.py",
    "zero_train/sharding/zero3_comm.py",
)


def _module_path(root: pathlib.Path, dotted: str) -> pathlib.Path | None:
    base = root / dotted.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def reached(root: pathlib.Path, start: pathlib.Path) -> set[pathlib.Path]:
    """Every sharding module (comm/ aside) the stage's module imports, directly or not, itself included."""
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen or str(path.relative_to(root)).startswith(COMM):
            continue
        seen.add(path)
        for package, names in IMPORT.findall(path.read_text()):
            for name in [package + "." + n.strip(" ()") for n in names.split(",")] + [package]:
                target = _module_path(root, name)
                if target is not None and target.name != "__init__.py":
                    todo.append(target)
    return seen


def budgets(root: pathlib.Path) -> dict[str, int]:
    """{stage: lines to read beyond the stages before it}."""
    read: set[pathlib.Path] = set()
    counts = {}
    for stage, candidates in STAGES.items():
        start = next(root / c for c in candidates if (root / c).is_file())
        new = reached(root, start) - read
        counts[stage] = sum(len(path.read_text().splitlines()) for path in new)
        read |= new
    return counts


def code_lines(path: pathlib.Path) -> int:
    """Lines of `path` that are code: not blank, not a comment, not part of a docstring or attribute docstring."""
    text = path.read_text()
    prose = set()
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            prose.update(range(node.lineno, node.end_lineno + 1))
    lines = text.splitlines()
    return sum(
        1
        for n, line in enumerate(lines, 1)
        if n not in prose and line.strip() and not line.strip().startswith("#")
    )


def main() -> None:
    args = [arg for arg in sys.argv[1:] if arg != "--code"]
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parents[1])
    read: set[pathlib.Path] = set()
    for stage, lines in budgets(root).items():
        print(f"{stage}: {lines} lines (budget {BUDGETS[stage]})")
        if "--code" in sys.argv:
            start = next(root / c for c in STAGES[stage] if (root / c).is_file())
            new = sorted(reached(root, start) - read)
            read |= set(new)
            for path in new:
                print(
                    f"    {len(path.read_text().splitlines()):5d} lines {code_lines(path):5d} code  {path.relative_to(root)}"
                )
            print(f"    {sum(map(code_lines, new)):17d} code")


if __name__ == "__main__":
    main()
