#!/usr/bin/env bash
# Make the project's virtual environment (.venv) from the pinned requirements.
# Idempotent: does nothing when .venv already matches requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
rm -rf .venv
if ! "$python" -m venv .venv; then
    echo "bootstrap: '$python -m venv' failed; install python3-venv (apt-get install python3-venv)" >&2
    exit 1
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
echo "$want" > "$stamp"
