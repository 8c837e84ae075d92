#!/usr/bin/env bash
# The project's test command (README, .ci/run): system packages, the virtual
# environment, lint, module docs, then every test.
#   ./scripts/test.sh            everything
#   ./scripts/test.sh -k plan    extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

step() { printf '\n== %s\n' "$*"; }

step "system packages"
./scripts/setup-system.sh
step "virtual environment"
./scripts/bootstrap.sh
bin=.venv/bin

step "lint: ruff"
"$bin/ruff" check .
"$bin/ruff" format --check .
step "lint: yamllint"
"$bin/yamllint" -s .
step "lint: ansible-lint (production profile)"
PATH="$PWD/$bin:$PATH" "$bin/ansible-lint" --offline -q
step "module docs: ansible-doc"
for module in library/*.py; do
    name=$(basename "$module" .py)
    "$bin/ansible-doc" -t module "$name" >/dev/null || { echo "ansible-doc cannot render $name" >&2; exit 1; }
    echo "ok: $name"
done

step "tests"
"$bin/python" -m pytest -n "${CPUPOOLS_TEST_JOBS:-2}" "$@"
