#!/usr/bin/env bash
# Make the project's virtual environment (.venv) from pinned requirements.
#   ./scripts/bootstrap.sh run   what a run of site.yml needs (requirements-run.txt; scripts/run.sh)
#   ./scripts/bootstrap.sh dev   the run set plus the test and lint tools (requirements-dev.txt; scripts/test.sh)
# Idempotent: does nothing when .venv already holds the set asked for. A dev
# environment also serves "run" (requirements-dev.txt holds every pin of
# requirements-run.txt at the same version), so run.sh after test.sh keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
set_name=${1:-dev}
case "$set_name" in
    run) accept="requirements-run.txt requirements-dev.txt" ;;
    dev) accept="requirements-dev.txt" ;;
    *) echo "bootstrap: unknown set '$set_name' (run or dev)" >&2; exit 2 ;;
esac
file=requirements-$set_name.txt
python=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
have=$(cat "$stamp" 2>/dev/null || true)
if [ -x .venv/bin/python ]; then
    for candidate in $accept; do
        if [ "$have" = "$(sha256sum "$candidate" | cut -d' ' -f1)" ]; then
            exit 0
        fi
    done
fi
rm -rf .venv
if ! "$python" -m venv .venv; then
    echo "bootstrap: '$python -m venv' failed; install python3-venv (apt-get install python3-venv)" >&2
    exit 1
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$file"
sha256sum "$file" | cut -d' ' -f1 > "$stamp"
