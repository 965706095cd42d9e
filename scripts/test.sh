#!/usr/bin/env bash
# Install trl_groupx with its test extras on CPU and run the test suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
# CPU torch first, so that resolving trl/transformers does not pull a multi-GB CUDA build.
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 OMP_NUM_THREADS=1
python3 -m pytest tests -p no:cacheprovider "$@"
