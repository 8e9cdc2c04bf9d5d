"""Run the out-of-sample memory matrix and compare our peak model with every measured peak.

    python scripts/memory_matrix.py --out runs/memory-matrix                 # the 64 cells (docs/memory_matrix.md)
    python scripts/memory_matrix.py --out runs/memory-matrix --list          # the design, nothing run
    python scripts/memory_matrix.py --out DIR --cells llama-ds2-w2-bf16-ga4-ckpt,qwen2-zero1-w3-fp32
    python scripts/memory_matrix.py --out runs/memory-matrix --reuse         # re-summarize, rerun only missing
    python scripts/memory_matrix.py --design wide --out runs/matrix-wide     # 485 cells, the 5% goal
    zero-train report runs/memory-matrix/llama                               # the full report of one architecture

The design (zero_train.report.matrix): three architectures built from small configs (random weights, saved
once under OUT/models/), checkpointing on/off, accumulation 1/4, world sizes 2/3, fp32/bf16, six engines;
48 cells in which every level of every factor meets every engine, 8 offload cells, 8 of our ZeRO-3. Each
cell is what a `zero-train profile` cell runs (scripts/train.py's training loop with --memory-report, 2
optimizer steps, a generated DeepSpeed config), its record under OUT/<architecture>/cells/; to spare 64 x 2-3
interpreter starts on a loaded machine, the cells of one world size run in the same rank processes one after
another (zero_train.testing.run_ranks), DeepSpeed ZeRO-3 last, two such groups at once (--parallel: a 1-rank
group alone leaves a core idle; a peak is per process, so concurrent groups do not change one); each group
says its wall time and its ranks' CPU seconds, the run its totals (the CPU seconds do not depend on the load). The comparison is per run (peak minus that run's "other"), so what earlier cells
leave behind cancels out of the headline figure; it does raise the "baseline". Then every record goes through the report's comparison
(zero_train.report.compare.compare_cell) and OUT/matrix.md + OUT/matrix.json get the headline figure, ours
/ (peak - other), per cell with its distribution, and per phase where a cell misses.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from zero_train.ds_config import write_config
from zero_train.hf.offline import DEFAULT_TOKENIZER_NAME
from zero_train.launch.cells import cell_config, cell_name
from zero_train.launch.launcher import model_meta
from zero_train.memory.record import error_record, load_record, write_record
from zero_train.registry import engine_spec
from zero_train.report.matrix import (
    ARCHITECTURES,
    BLOCK_SIZE,
    MICRO_BATCH_SIZE,
    OFFLOAD_SUFFIX,
    base_engine,
    design,
    summarize,
    wide_design,
)
from zero_train.runtime.errors import UsageError, run_cli
from zero_train.runtime.outputs import check_output_dir
from zero_train.runtime.parser import OneLineParser, positive_float, positive_int
from zero_train.train import config as run
from zero_train.train.args import parse_args, run_argv
from zero_train.train.setup import plan_run

DESIGNS = {"compact": (design, 0.10, 8), "wide": (wide_design, 0.05, 24)}
"""--design -> (its cells, the goal |ours / (peak - other) - 1|, cells per group of rank processes: one
interpreter start per rank per group)."""


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="memory_matrix.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--design", choices=tuple(DESIGNS), default="compact",
        help="compact: the 76-cell fraction (10%% goal); wide: every engine x precision x 1/2/4 ranks x "
        "plain/checkpointing/accumulation 4/LoRA on two new shapes, and five 0.36B cells (5%% goal)",
    )  # fmt: skip
    parser.add_argument("--cells", default=None, help="comma-separated cell names (default: all)")
    parser.add_argument("--list", action="store_true", help="print the design and exit")
    parser.add_argument("--reuse", action="store_true", help="keep cells already recorded in OUT")
    parser.add_argument(
        "--summarize-only", action="store_true", help="run nothing: compare the cells recorded in OUT so far"
    )
    parser.add_argument(
        "--full-reference", default="docs/report/matrix.json",
        help="a matrix.json whose full fine-tuning cells stand beside the LoRA cells not run here",
    )  # fmt: skip
    parser.add_argument("--steps", type=positive_int, default=2, help="optimizer steps per cell (default 2)")
    parser.add_argument("--timeout", type=positive_float, default=300, help="seconds per cell (default 300)")
    parser.add_argument(
        "--parallel", type=positive_int, default=2,
        help="groups of rank processes at once (default 2, this machine's cores; the 0.36B cells always alone)",
    )  # fmt: skip
    parser.add_argument(
        "--extensions-dir", default="/tmp/zt-ext",
        help="TORCH_EXTENSIONS_DIR for the offload cells' DeepSpeedCPUAdam kernel (built once, default /tmp/zt-ext)",
    )  # fmt: skip
    return parser


def build_model_folder(architecture: str, out: pathlib.Path) -> pathlib.Path:
    """OUT/models/<architecture>: config.json + random weights (seed 0), the offline tokenizer's vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from zero_train.hf.offline import EOS_TOKEN_ID, OFFLINE_VOCAB_SIZE

    folder = out / "models" / architecture
    if (folder / "config.json").exists():
        return folder
    kwargs = dict(ARCHITECTURES[architecture])
    config = CONFIG_MAPPING[kwargs.pop("model_type")](
        **kwargs, vocab_size=OFFLINE_VOCAB_SIZE, bos_token_id=EOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def _paths(cell, args: argparse.Namespace) -> tuple[pathlib.Path, pathlib.Path]:
    """(its DeepSpeed config, its run record) under OUT/<architecture>/, named as `zero-train profile` does."""
    arch_out = pathlib.Path(args.out) / cell.architecture
    stem = cell_name(cell.engine, cell.world_size, cell.precision, grad_accum=cell.grad_accum,
                     checkpointing=cell.gradient_checkpointing) + (f"-lora{cell.lora_r}" if cell.lora_r else "")  # fmt: skip
    return arch_out / "configs" / f"{stem}.json", arch_out / "cells" / f"{stem}.json"


def _train_argv(cell, args: argparse.Namespace) -> list[str]:
    """The training run's flags for one cell (config generated as `zero-train profile` does)."""
    model = build_model_folder(cell.architecture, pathlib.Path(args.out))
    config_path, record_path = _paths(cell, args)
    for path in (config_path, record_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    hidden = model_meta(str(model), BLOCK_SIZE)["hidden_size"]
    engine = base_engine(cell.engine)
    ds_config = cell_config(engine, cell.world_size, precision=cell.precision, micro_batch_size=MICRO_BATCH_SIZE,
                            grad_accum=cell.grad_accum, hidden_size=hidden)  # fmt: skip
    write_config(_with_offload(ds_config, cell.engine), config_path)
    return run_argv(run.RunConfig(
        model=run.ModelConfig(model=str(model), tokenizer=DEFAULT_TOKENIZER_NAME,
                              gradient_checkpointing=cell.gradient_checkpointing),
        lora=run.LoraConfig(r=cell.lora_r),
        data=run.DataConfig(block_size=BLOCK_SIZE),
        training=run.TrainingConfig(max_steps=args.steps, micro_batch_size=MICRO_BATCH_SIZE, grad_accum=cell.grad_accum),
        engine=run.EngineConfig(engine=engine, deepspeed_config=str(config_path)),
        evaluation=run.EvalConfig(eval_batches=1),
        output=run.OutputConfig(memory_report=str(record_path), progress=False),
    ))  # fmt: skip


def _with_offload(config: dict, engine: str) -> dict:
    """An offload cell's config: offload_optimizer cpu (ZeRO-2, ZeRO-3) and offload_param cpu (ZeRO-3), as
    zero_train.ds_config.generate writes them (DeepSpeedCPUAdam: no torch_adam)."""
    if engine.endswith(OFFLOAD_SUFFIX):
        config.get("optimizer", {}).get("params", {}).pop("torch_adam", None)
        zero = config["zero_optimization"]
        zero["offload_optimizer"] = {"device": "cpu"}
        if zero["stage"] == 3:
            zero["offload_param"] = {"device": "cpu"}
    return config


def _train_cells(rank: int, world_size: int, argvs: list[list[str]]) -> tuple[list[str | None], float]:
    """In each rank: train every cell in turn (one process for all: no per-cell imports); (errors by cell,
    this rank's CPU seconds for the group, its imports included)."""
    cpu_started = time.process_time()
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.loop import Trainer

    errors: list[str | None] = []
    for argv in argvs:
        try:
            config = parse_args(argv)
            Trainer(config, plan_run(config, world_size=world_size), init_distributed()).run()
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - one cell's failure is recorded, the matrix goes on
            errors.append(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        gc.collect()
    return errors, time.process_time() - cpu_started


def _chunks(cells: list, size: int) -> list[list]:
    """Groups of at most `size` cells of one world size, engines mixed, ZeRO-3 last in each; the world sizes
    alternate, so that an interrupted run has recorded a bit of everything (--reuse continues it)."""
    by_size: dict[int, list[list]] = {}
    for world_size in sorted({cell.world_size for cell in cells}):
        mine = [cell for cell in cells if cell.world_size == world_size]
        count = -(-len(mine) // size)
        by_size[world_size] = [sorted(mine[i::count], key=lambda c: c.engine == "ds3") for i in range(count)]
    longest = max((len(groups) for groups in by_size.values()), default=0)
    return [groups[i] for i in range(longest) for groups in by_size.values() if i < len(groups)]


def _ordered_chunks(cells: list, size: int) -> list[list]:
    """Groups of at most `size` cells of one world size in the design's order (what it runs last stays last),
    DeepSpeed ZeRO-3 last in each."""
    groups, open_groups = [], {}
    for cell in cells:
        group = open_groups.setdefault(cell.world_size, [])
        group.append(cell)
        if len(group) == size:
            groups.append(open_groups.pop(cell.world_size))
    groups += open_groups.values()
    return [sorted(group, key=lambda c: c.engine == "ds3") for group in groups]


def recorded(cells: list, args: argparse.Namespace) -> dict[str, dict]:
    """The run records already in OUT, by cell name (cells not run yet left out)."""
    paths = {cell.name: _paths(cell, args)[1] for cell in cells}
    return {name: load_record(path) for name, path in paths.items() if path.exists()}


def run_cells(cells: list, args: argparse.Namespace) -> dict[str, dict]:
    """Run the cells (by world size, DeepSpeed ZeRO-3 last: transformers keeps its config global), each rank
    one process for its whole group, `--parallel` groups at once (a 1-rank group keeps one core busy, and a
    peak is per process: concurrent groups do not change one); the 0.36B cells' groups alone, after the rest
    (GBs per rank). Returns every cell's run record by name; adds the wall and CPU seconds to args.timing."""
    from zero_train.report.matrix import LARGE_ARCHITECTURE
    from zero_train.testing import rank_context

    records, todo = {}, []
    for cell in cells:
        record_path = _paths(cell, args)[1]
        if args.reuse and record_path.exists() and load_record(record_path).get("error") is None:
            records[cell.name] = load_record(record_path)
        else:
            record_path.unlink(missing_ok=True)
            todo.append(cell)
    chunker = _chunks if args.design == "compact" else _ordered_chunks
    size = DESIGNS[args.design][2]
    small = chunker([cell for cell in todo if cell.architecture != LARGE_ARCHITECTURE], size)
    large = chunker([cell for cell in todo if cell.architecture == LARGE_ARCHITECTURE], size)
    prepared = [
        (group, [_train_argv(cell, args) for cell in group]) for group in small + large
    ]  # models built once
    rank_context()  # the forkserver, started once before any thread uses it
    started, cpu = time.perf_counter(), []

    def run_group(group: list, argvs: list[list[str]]) -> None:
        group_started = time.perf_counter()
        results = _run_group(group, argvs, args)
        cpu.append(sum(seconds for _, seconds in results))
        records.update(_recorded_group(group, [errors for errors, _ in results][0], args))
        print(f"world size {group[0].world_size}: {len(group)} cells in {time.perf_counter() - group_started:.0f} s "
              f"({cpu[-1]:.0f} CPU-s over its ranks)", flush=True)  # fmt: skip

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for future in [pool.submit(run_group, *item) for item in prepared[: len(small)]]:
            future.result()
    for item in prepared[len(small) :]:
        run_group(*item)
    args.timing = dict(wall_s=round(time.perf_counter() - started), cpu_s=round(sum(cpu)), groups=len(prepared),
                       parallel=args.parallel)  # fmt: skip
    return records


def _run_group(group: list, argvs: list[list[str]], args: argparse.Namespace) -> list[tuple[list, float]]:
    """One group's ranks: [(errors by cell, CPU seconds)] by rank; a group that fails as a whole (a rank
    killed, its time out) records that error in every cell."""
    from zero_train.testing import run_ranks

    try:
        return run_ranks(
            _train_cells, group[0].world_size, args=(argvs,), timeout_s=args.timeout * len(group)
        )
    except RuntimeError as err:
        return [([f"group failed: {str(err).splitlines()[-1]}"] * len(group), 0.0)]


def _recorded_group(group: list, errors: list, args: argparse.Namespace) -> dict[str, dict]:
    """The group's run records, each with its model's facts (an error record where the cell failed)."""
    records = {}
    for cell, error in zip(group, errors, strict=True):
        record_path = _paths(cell, args)[1]
        meta = model_meta(str(build_model_folder(cell.architecture, pathlib.Path(args.out))), BLOCK_SIZE)
        meta.pop("hidden_size")
        if cell.lora_r:
            meta.pop("num_params")  # the run's own count has the adapters (the folder's has the base only)
        if error or not record_path.exists():
            record = error_record(
                error or "no run record written", engine=base_engine(cell.engine), world_size=cell.world_size
            )
        else:
            record = load_record(record_path)
        engine = base_engine(cell.engine)  # the offload is in the record's ds_config
        record.update(meta, engine=engine, zero_stage=engine_spec(engine).stage)
        write_record(record, record_path)
        records[cell.name] = record
    return records


def _build_kernel(extensions_dir: str) -> None:
    """Build (or load) DeepSpeedCPUAdam's kernel once, before the ranks start (they inherit the folder)."""
    from zero_train.engines.deepspeed_offload import build_cpu_adam

    seconds = build_cpu_adam(extensions_dir)
    print(f"DeepSpeedCPUAdam kernel: {seconds:.1f} s to build or load in {extensions_dir}", flush=True)


def compare(cell, record: dict) -> dict:
    """The report's comparison row of one record, with the matrix cell's name and factors."""
    from zero_train.report.compare import compare_cell
    from zero_train.report.models import model_facts

    row = compare_cell(record, model_facts(record["model"], record["num_params"], record.get("lora")))
    row.update(matrix_cell=cell.name, matrix=asdict(cell))
    if cell.lora_r and not record.get("error"):
        from zero_train.report.matrix_lora import full_twin_model

        row.update(full_twin_cell=cell.full_twin, full_twin=full_twin_model(record))
    return row


def _reference(path: str | None) -> dict[str, int]:
    """Measured peak minus other of full fine-tuning cells by name, from another run's matrix.json."""
    if not path or not pathlib.Path(path).is_file():
        return {}
    saved = json.loads(pathlib.Path(path).read_text())
    cells = saved.get("cells") or [dict(row.get("peak", {}), cell=row.get("matrix_cell"))
                                   for row in saved.get("rows", [])]  # fmt: skip
    return {c["cell"]: c["measured_without_other"] for c in cells if c.get("measured_without_other")}


def _selected(names: str | None, design_name: str) -> list:
    cells = DESIGNS[design_name][0]()
    if not names:
        return cells
    by_name = {cell.name: cell for cell in cells}
    unknown = [name for name in names.split(",") if name not in by_name]
    if unknown:
        raise UsageError(f"unknown cell {unknown[0]!r}; see `scripts/memory_matrix.py --out DIR --list`")
    return [by_name[name] for name in names.split(",")]


def main(argv: list[str]) -> int:
    """Run the selected cells, compare, write OUT/matrix.json and OUT/matrix.md."""
    from zero_train.report.matrix_markdown import render_matrix

    args = _parser().parse_args(argv)
    cells = _selected(args.cells, args.design)
    goal = DESIGNS[args.design][1]
    if args.list:
        print("\n".join(cell.name for cell in cells))
        return 0
    check_output_dir(args.out, flag="--out")
    if not args.summarize_only and any(cell.engine.endswith("-offload") for cell in cells):
        _build_kernel(args.extensions_dir)
    records = recorded(cells, args) if args.summarize_only else run_cells(cells, args)
    rows = []
    for cell in (cell for cell in cells if cell.name in records):
        rows.append(compare(cell, records[cell.name]))
        ratio = (rows[-1].get("peak") or {}).get("ratio_without_other")
        status = records[cell.name].get("error") or (f"ours / (peak - other) {ratio:.3f}" if ratio else "n/a")
        print(f"  {cell.name:<36} {status}", flush=True)
    summary = dict(summarize(rows, goal), design_cells=len(cells), timing=getattr(args, "timing", None))
    out = pathlib.Path(args.out)
    (out / "matrix.json").write_text(json.dumps(dict(summary=summary, rows=rows), indent=1, default=str))
    from zero_train.report.matrix_lora import render_lora

    lora = render_lora(rows, _reference(args.full_reference))
    (out / "matrix.md").write_text(render_matrix(summary, rows, goal) + ("\n" + lora if lora else ""))
    ratio = summary["ratio"]
    print(f"{summary['within']} of {len(rows) - len(summary['failed'])} cells within {goal:.0%}; ours / (peak - "
          f"other): min {ratio['min']}, median {ratio['median']}, max {ratio['max']} -> {out / 'matrix.md'}")  # fmt: skip
    if summary["timing"]:
        print("ran {groups} groups, {parallel} at a time: {wall_s} s of wall time, {cpu_s} CPU-s over the ranks".format(
            **summary["timing"]))  # fmt: skip
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
