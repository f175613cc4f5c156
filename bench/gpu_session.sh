#!/usr/bin/env bash
# Issue 28's GPU measurements in one run, for a session that is lent a GPU for a few minutes:
# the step table (bench/gpu_step.py: plain / hush_hf / Opacus ghost, fresh processes), then the
# trainer row (bench/gpu_trainer.py: SecretProtectionTrainer against Trainer at the same B).
# Meant to fit 8 minutes on one H100 or H200. Usage: bash bench/gpu_session.sh [OUTPUT_DIR]
# On the lent machine, first carry the packages its image lacks: see bench/gpu_wheels.sh.
set -euo pipefail
out="${1:-.}"
python="${PYTHON:-python}"
"$python" bench/gpu_step.py --timeout 150 | tee "$out/gpu_step.md"
"$python" bench/gpu_trainer.py --timeout 150 | tee "$out/gpu_trainer.md"
