#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU:  bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ZT_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q tests "$@"
