#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU:  bash scripts/test.sh [pytest args]
#   bash scripts/test.sh -m quick      # the inner loop: single-process tests only
# Two pytest-xdist workers by default (ZT_TEST_WORKERS=N to change, 0 for none): most of the suite waits on
# launchers starting, ranks in collectives and timeouts, so two workers overlap that waiting on 2 cores.
# Each test file stays on one worker (--dist loadfile): its module fixtures (a profile, a launch) run once;
# files go out in the order tests/conftest.py gives (launching files first), not xdist's by test count.
# --durations=15: every run ends with its 15 slowest test phases above pytest's summary line, so that a
# test that grows slow shows in the next CI log.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ZT_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PATH="$PWD/.venv/bin:$PATH"  # as an activated venv: its ninja, which built DeepSpeed's ops (setup.sh)
exec .venv/bin/python -m pytest -q -n "${ZT_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=15 tests "$@"
