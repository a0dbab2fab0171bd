#!/usr/bin/env bash
# Create or update the project's virtual environment in .venv.
#
# The order matters. torch's CPU build goes in first and stays pinned through the
# rest of the install (a constraint, not just a prior install: optimum-intel pulls
# torchvision, whose newest release would otherwise upgrade torch to a multi-GB CUDA
# build). torchvision is removed at the end: PyPI's build does not import beside the
# CPU torch, and nothing here needs it. A stamp of the inputs makes re-runs instant.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${APPLIANCE_VENV:-.venv}
torch_pin=${APPLIANCE_TORCH:-torch==2.13.0}
python=${PYTHON:-python3}
stamp="$venv/.appliance-stamp"
want=$( (cat pyproject.toml installer/venv.sh; echo "$torch_pin") | sha256sum | cut -d' ' -f1)

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

echo "installer: setting up $venv (a few minutes on a fresh machine)" >&2
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "$torch_pin" > "$constraints"

pip() {
    # This machine's pip configuration names local indexes that may be absent; their
    # warnings are noise, everything else is shown.
    "$venv/bin/python" -m pip --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
    return "${PIPESTATUS[0]}"
}
pip install --upgrade pip setuptools wheel
pip install "$torch_pin"
pip install --constraint "$constraints" -e ".[dev,burst,bench]"
pip uninstall -y torchvision >/dev/null 2>&1 || true
# For the tests only: optimum's ONNX exporter, which pins a transformers older than the appliance's, goes into a
# folder of its own that tests/test_imports.py puts on one subprocess's path, to export a checkpoint to ONNX the
# way a partner would (the venv's torch, onnx and tokenizers serve it too).
rm -rf "$venv/optimum-onnx"
pip install --target "$venv/optimum-onnx" --no-deps optimum-onnx==0.1.0 optimum==2.1.0 transformers==4.57.6 \
    huggingface_hub==0.36.2

"$venv/bin/python" - "$torch_pin" <<'PY'
import sys
import torch, openvino, cryptography, sqlite_utils  # noqa: F401  the stack imports
want = sys.argv[1].split("==")[-1]
if not torch.__version__.startswith(want):
    sys.exit(f"installer: torch {torch.__version__} was installed, expected {want}")
PY
echo "$want" > "$stamp"
echo "installer: $venv ready" >&2
