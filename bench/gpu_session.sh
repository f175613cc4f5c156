#!/usr/bin/env bash
# Issue 28's GPU measurements in one run, for a session that is lent a GPU for a few minutes:
# the exactness table (bench/gpu_exactness.py: CUDA routes and TF32 against the float64 reference),
# the step table with one profiled step per plain / hush_hf cell (bench/gpu_step.py: plain / hush_hf /
# Opacus ghost, fresh processes), then the trainer row (bench/gpu_trainer.py: SecretProtectionTrainer
# against Trainer at the same B). Each part has its own time limit, so a slow part cannot lose the
# others; about 8 minutes at most on one H100 or H200. Opacus's cells were measured on 2026-11-28
# (docs/benchmarks.md) and are left out unless OPACUS=1 (a third more time for the step table).
# Usage: [OPACUS=1] bash bench/gpu_session.sh [OUTPUT_DIR]
# On the lent machine, first carry the packages its image lacks: see bench/gpu_wheels.sh.
set -uo pipefail
out="${1:-.}"
python="${PYTHON:-python}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
for package in transformers peft; do  # the carried version when it imports, else the image's own
  if ! "$python" -c "import $package" 2>>"$out/stderr.log"; then
    echo "carried $package does not import here: the image's is used" | tee -a "$out/stderr.log"
    [ -n "${PYTHONPATH:-}" ] && rm -rf "$PYTHONPATH/$package" "$PYTHONPATH/$package"-*.dist-info
  fi
done
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$python" -c "import torch, transformers, peft; print('torch', torch.__version__, '| transformers',
      transformers.__version__, '| peft', peft.__version__, '| cuda', torch.version.cuda)"
} 2>>"$out/stderr.log" | tee "$out/gpu_env.txt"
timeout 110 "$python" bench/gpu_exactness.py 2>>"$out/stderr.log" | tee "$out/gpu_exactness.md"
contenders="plain hush"
[ "${OPACUS:-0}" = 1 ] && contenders="plain hush opacus-ghost"
# shellcheck disable=SC2086  # the contenders are words
timeout 290 "$python" bench/gpu_step.py --contenders $contenders --timeout 90 --profile "$out/gpu_profile.md" \
  2>>"$out/stderr.log" | tee "$out/gpu_step.md"
timeout 200 "$python" bench/gpu_trainer.py --timeout 90 --steps 8 2>>"$out/stderr.log" | tee "$out/gpu_trainer.md"
