"""Run records -> report: Markdown, PNG plots and a JSON summary, measured next to theory.

    zero-train profile --model tiny --world-sizes 1,2 --out runs/profile
    zero-train report runs/profile                 # runs/profile/report/{report.md, *.png, summary.json, cells.json}

Modules, in the order data flows through them:
    models.py    the model facts theory needs (shape, parameter sizes), rebuilt from a record's model name
    compare.py   pure: one run record -> one comparison row (measured vs paper vs DeepSpeed vs ours)
    traffic.py   pure: communication per step vs the paper's volume
    explain.py   pure: the sentences that explain every large gap, from the categories
    explain_peak.py     pure: the peak in words: where it happened, what our phase model holds then
    explain_runtime.py  pure: what no model-state formula covers: "other" and communication per step
    buffers.py   pure: the communication buffers each engine keeps, in words
    units.py     how numbers read (MB, bytes/param, ratios)
    summary.py   the machine-readable summary.json, and cells.json: its numbers that matter per cell
    markdown.py  report.md (markdown_text.py: its fixed prose)
    plots.py     PNG plots (matplotlib, Agg backend)
    build.py     loads the records, writes everything into OUT (nothing left behind on failure)
    matrix.py    the out-of-sample memory matrix (scripts/memory_matrix.py): its cells and what they say together
    matrix_markdown.py  its matrix.md
"""
