"""From a profile directory to the report files: load, compare, explain, write (all or nothing).

    from zero_train.report.build import write_report
    paths = write_report("runs/profile", "runs/profile/report")   # report.md, *.png, summary.json, cells.json
    write_report("docs/report/summary.json", "docs/report", plots=False)   # re-rendered from a full summary

Everything is generated into a temporary folder inside OUT and only then moved into OUT, so a failure
(unwritable OUT, a plotting error) leaves no half-written report behind; a directory this call created
is removed again.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

from zero_train.memory.record import load_records
from zero_train.registry import REFERENCE
from zero_train.report.compare import cell_sort_key, compare_cell
from zero_train.report.explain import explain_cell
from zero_train.report.markdown import render_report
from zero_train.report.models import model_facts
from zero_train.report.summary import CELL_KEYS, SCHEMA, build_summary, write_cells, write_summary
from zero_train.runtime.errors import UsageError
from zero_train.runtime.outputs import check_output_dir

REPORT_NAME = "report.md"
SUMMARY_NAME = "summary.json"
CELLS_NAME = "cells.json"


def analyze(records: list[dict]) -> list[dict]:
    """Comparison rows of every record (sorted: model, precision, world size, engine), explained.

    Args:
        records: validated run records.

    Returns:
        One row per record; successful rows carry "explanations" (a list of sentences).
    """

    rows, facts_of = [], {}
    for record in sorted(records, key=cell_sort_key):
        lookup = model_facts(record.get("model"), record.get("num_params"), record.get("lora"))
        row = compare_cell(record, lookup)
        facts_of[row["cell"]] = lookup.facts
        rows.append(row)
    references = {
        (row["model"], row["precision"], row["world_size"]): row
        for row in rows
        if row["engine"] == REFERENCE and row["error"] is None
    }
    for row in rows:
        if row["error"] is None:
            reference = references.get((row["model"], row["precision"], row["world_size"]))
            row["explanations"] = explain_cell(row, facts_of[row["cell"]], reference)
    return rows


def _load(directory: pathlib.Path) -> list[dict]:
    """The records, or a UsageError of ONE line (a record's further schema problems are counted, not listed)."""
    try:
        return load_records(directory)
    except UsageError as err:
        more = f" (and {len(err.problems)} more problem(s) in that file)" if err.problems else ""
        raise UsageError(f"{err}{more}") from None


def _summary_rows(path: pathlib.Path) -> tuple[list[dict], str]:
    """The rows (cells, then failed cells) and the records' source of a report's summary.json."""

    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(
            f"cannot read {path} ({err}); give a profile directory or a report's summary.json"
        ) from None
    if not isinstance(summary, dict) or summary.get("schema") != SCHEMA:
        raise UsageError(f"{path} is not a report's summary.json (schema {SCHEMA}); give a profile directory")
    missing = sorted({key for cell in summary["cells"] for key in CELL_KEYS if key not in cell})
    if missing:
        raise UsageError(
            f"{path} was written by an older `zero-train report` (its cells lack {', '.join(missing)}); "
            "run `zero-train report` on its profile directory"
        )
    return summary["cells"] + summary["failed"], summary["source"]


def _generate(rows: list[dict], source: str, staging: pathlib.Path, *, plots: bool) -> list[str]:
    """Write the plots (if asked), summary.json, cells.json and report.md into `staging`; return the file names."""

    images: dict[str, list[str]] = {"bytes_per_param": [], "categories": []}
    if plots:
        from zero_train.report.plots import write_plots  # expensive: matplotlib (seconds), only with plots

        images = write_plots(rows, staging)
    files = [REPORT_NAME, SUMMARY_NAME, CELLS_NAME, *images["bytes_per_param"], *images["categories"]]
    summary = build_summary(rows, source=source, files=files)
    write_summary(summary, staging / SUMMARY_NAME)
    write_cells(summary, staging / CELLS_NAME)
    (staging / REPORT_NAME).write_text(render_report(summary, images))
    return files


def _make_out(out: pathlib.Path) -> list[pathlib.Path]:
    """Create OUT (and missing parents); return the directories created, outermost first."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory for the report")
    created = [p for p in reversed([out, *out.parents]) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(
            f"cannot create the report directory {out} ({err.strerror}); choose another --out"
        ) from None
    return created


def _check_out(directory: pathlib.Path, out: pathlib.Path) -> None:
    resolved_dir, resolved_out = directory.resolve(), out.resolve()
    if resolved_out == resolved_dir or resolved_out in resolved_dir.parents:
        raise UsageError(
            f"--out {out} would contain the run records of {directory}; use e.g. {directory}/report"
        )


def write_report(directory, out, *, plots: bool = True) -> dict[str, pathlib.Path]:
    """Read DIR's run records and write report.md, the PNG plots, summary.json and cells.json into OUT.

    Args:
        directory: a `zero-train profile --out` directory (or a directory of run record JSON files), or a
            report's summary.json, whose cells are rendered again without their run records.
        out: where the report goes (created if missing; files of the same names are replaced).
        plots: write the PNG plots (report.md links them); without them report.md links none.

    Returns:
        file name -> path of every file written.

    Raises:
        UsageError: no or invalid records, or OUT cannot be written; nothing is left in OUT then.
    """
    directory = pathlib.Path(directory)
    if directory.is_file():
        rows, source = _summary_rows(directory)
        out = check_output_dir(out, flag="--out")
    else:
        records = _load(directory)
        out = check_output_dir(out, flag="--out")  # probed before any work: a file, /proc, a read-only folder
        _check_out(directory, out)
        rows, source = analyze(records), str(directory)
    created = _make_out(out)
    try:
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".report-", dir=out))
    except OSError as err:
        _remove(created)
        raise UsageError(f"cannot write into {out} ({err.strerror}); choose another --out") from None
    try:
        files = _generate(rows, source, staging, plots=plots)
        paths = {name: out / name for name in files}
        for name, path in paths.items():
            (staging / name).replace(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove(created)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return paths


def _remove(created: list[pathlib.Path]) -> None:
    if created:
        shutil.rmtree(created[0], ignore_errors=True)
