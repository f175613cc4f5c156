#!/usr/bin/env bash
# The wheels the lent GPU machine lacks (its image has torch 2.11, transformers 5.17, peft, accelerate,
# pyarrow, huggingface_hub 1.33, but not the others), and the transformers and peft this project is
# tested with (and the regex that transformers 5.24 asks for), fetched here into .whl/ (git-ignored
# through .git/info/exclude) for `carry`:
#   bash bench/gpu_wheels.sh
# then, with the device tool: carry [".whl"], command
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site && PYTHON=python3 bash bench/gpu_session.sh "$OUT"
# (about 35 MB; the versions `make install` put in .venv on 2026-11-28, for the machine's Python 3.12;
# gpu_session.sh falls back to the image's transformers and peft when the carried ones do not import.)
set -euo pipefail
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 highspy==1.16.0 PuLP==3.3.2 dp-accounting==0.6.0 \
  opacus==1.6.0 transformers==5.24.0 peft==0.21.2 regex==2026.11.19
ls .whl
