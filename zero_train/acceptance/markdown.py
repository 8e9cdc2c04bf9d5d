"""gpu_check.md: the device, the verdict, and every check as a table row (failed ones first)."""

from __future__ import annotations

STATUS = {True: "passed", False: "**FAILED**", None: "cannot run here"}


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{key} {_number(item)}" for key, item in value.items())
    return "" if value is None else str(value)


def render(result: dict) -> str:
    """The Markdown of one gpu_check.json."""
    checks = result["checks"]
    asserted = [check for check in checks if check["kind"] == "assert"]
    passed = sum(check["passed"] is True for check in asserted)
    not_run = sum(check["passed"] is None for check in checks)
    lines = [
        f"# zero-train gpu-check: {result['device']}",
        "",
        f"{'FAILED' if result['failed'] else 'PASSED'}: {passed} of {len(asserted)} asserted checks passed, "
        f"{result['failed']} failed; {len(checks) - len(asserted)} measurements; {not_run} cannot run here. "
        f"Model {result['model']}, {result['world_size']} rank(s), {result['wall_s']:.0f} s, {result['started']}.",
        "",
        "Machine: "
        + ", ".join(f"{key} {value}" for key, value in result["machine"].items() if key != "device"),
        "",
        "| check | engine | status | value | limit | note |",
        "|---|---|---|---|---|---|",
    ]
    order = sorted(checks, key=lambda check: (check["passed"] is not False, check["kind"] != "assert"))
    for check in order:
        status = (
            STATUS[check["passed"]] if check["kind"] == "assert" or check["passed"] is None else "measured"
        )
        lines.append(
            f"| {check['name']} | {check['engine'] or '-'} | {status} | {_number(check['value'])} | "
            f"{_number(check['limit'])} | {check['note']} |"
        )
    return "\n".join(lines) + "\n"
