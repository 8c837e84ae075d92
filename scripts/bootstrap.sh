#!/usr/bin/env bash
# Make the project's virtual environment (.venv) from pinned requirements.
#   ./scripts/bootstrap.sh run   what a run of site.yml needs (requirements-run.txt; scripts/run.sh)
#   ./scripts/bootstrap.sh dev   the run set plus the test and lint tools (requirements-dev.txt; scripts/test.sh)
# Idempotent: does nothing when .venv already holds the set asked for, so
# run.sh after test.sh keeps the dev environment.
set -euo pipefail
cd "$(dirname "$0")/.."
set_name=${1:-dev}
case "$set_name" in
    run | dev) ;;
    *) echo "bootstrap: unknown set '$set_name' (run or dev)" >&2; exit 2 ;;
esac

# The controller's Python: $PYTHON when set, else the newest 3.12 or later
# found (python3.14 ... python3.12 on PATH, then pyenv's installs), else
# python3. ansible-core 2.20 and later run their controller on 3.12 or newer;
# on an older Python (Debian 12 has 3.11 only) the set is the -py311 one,
# ansible-core 2.19, and one line says so.
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }
python=${PYTHON:-}
if [ -z "$python" ]; then
    for candidate in python3.14 python3.13 python3.12 \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.14*/bin/python3 \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3 \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3; do
        if new_enough "$candidate"; then
            python=$candidate
            break
        fi
    done
fi
python=${python:-python3}
suffix=
if ! new_enough "$python"; then
    suffix=-py311
fi
file=requirements-$set_name$suffix.txt
# A dev environment also serves "run": requirements-dev*.txt holds every pin
# of requirements-run*.txt at the same version.
accept="requirements-dev$suffix.txt"
[ "$set_name" = dev ] || accept="$file $accept"

stamp=.venv/.requirements.sha256
have=$(cat "$stamp" 2>/dev/null || true)
if [ -x .venv/bin/python ]; then
    for candidate in $accept; do
        if [ "$have" = "$(sha256sum "$candidate" | cut -d' ' -f1)" ]; then
            exit 0
        fi
    done
fi
if [ -n "$suffix" ]; then
    echo "bootstrap: $("$python" -V 2>&1) is older than 3.12: ansible-core 2.19 ($file); with python3.12 or newer (or PYTHON=...) it is 2.21" >&2
fi
rm -rf .venv
if ! "$python" -m venv .venv; then
    echo "bootstrap: '$python -m venv' failed; install python3-venv (apt-get install python3-venv)" >&2
    exit 1
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$file"
sha256sum "$file" | cut -d' ' -f1 > "$stamp"
