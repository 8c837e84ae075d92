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
./scripts/bootstrap.sh dev
if [ "$(id -u)" = 0 ]; then
    step "molecule platform: podman, runc, the systemd base image"
    ./scripts/setup-molecule.sh
fi
bin=.venv/bin

step "lint: ruff"
"$bin/ruff" check .
"$bin/ruff" format --check .
step "lint: yamllint"
"$bin/yamllint" -s .
step "lint: ansible-lint (production profile)"
PATH="$PWD/$bin:$PATH" "$bin/ansible-lint" --offline -q
step "module docs: ansible-doc"
for module in plugins/modules/*.py; do
    name=$(basename "$module" .py)
    "$bin/ansible-doc" -t module "$name" >/dev/null || { echo "ansible-doc cannot render $name" >&2; exit 1; }
    echo "ok: $name"
done

# The CMK v1.4 interleaving test forces PID reuse through ns_last_pid. In a PID
# namespace of its own, with its own /proc, it moves only that namespace's
# counter, so it runs beside the other tests; scripts/pidns_init.py is the
# namespace's PID 1 (it reaps the orphans a killed agent leaves, which would
# otherwise stay zombies and look alive). Where unshare cannot make a PID
# namespace (no CAP_SYS_ADMIN), it runs as before: alone, first, in the
# machine's namespace, where it would reuse the PIDs of other tests.
pidreuse=("$bin/python" -m pytest -p no:xdist -m pidreuse -rs "$@")
pidreuse_pid=
if unshare --pid --fork --mount-proc true 2>/dev/null; then
    pidreuse_log=$(mktemp)
    unshare --pid --fork --mount-proc "$bin/python" scripts/pidns_init.py "${pidreuse[@]}" >"$pidreuse_log" 2>&1 &
    pidreuse_pid=$!
else
    step "CMK v1.4 interleaving (alone: unshare cannot make a PID namespace here, and it moves the PID counter)"
    rc=0
    "${pidreuse[@]}" || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
fi

# The molecule scenarios run one at a time (each boots a systemd container),
# beside the other tests: those keep two cores busy only ~80% of the time
# (measured: 1.6 CPU-seconds per second), a scenario mostly waits on its
# container, and the two together take the time of the longer rather than the
# sum. Nothing a scenario writes is in the checkout (its report goes to its
# own ephemeral directory). Its output is shown after the other tests'.
# Exit status 5 is "nothing selected" (a -k filter that matches no scenario).
if [ -n "$pidreuse_pid" ]; then
    step "tests, and beside them the CMK v1.4 interleaving test (in a PID namespace of its own) and the molecule scenarios"
else
    step "tests, and beside them the molecule scenarios"
fi
molecule_log=$(mktemp)
"$bin/python" -m pytest -p no:xdist -m molecule -rs --durations=0 "$@" >"$molecule_log" 2>&1 &
molecule_pid=$!
rc=0
"$bin/python" -m pytest -n "${CPUPOOLS_TEST_JOBS:-2}" -m "not molecule and not pidreuse" "$@" || rc=$?
pidreuse_rc=0
if [ -n "$pidreuse_pid" ]; then
    wait "$pidreuse_pid" || pidreuse_rc=$?
    step "CMK v1.4 interleaving (ran beside the tests above, in a PID namespace of its own)"
    cat "$pidreuse_log"
    rm -f "$pidreuse_log"
fi
molecule_rc=0
wait "$molecule_pid" || molecule_rc=$?
step "molecule scenarios (ran beside the tests above)"
cat "$molecule_log"
rm -f "$molecule_log"
[ "$rc" = 0 ] || exit "$rc"
[ "$pidreuse_rc" = 0 ] || [ "$pidreuse_rc" = 5 ] || exit "$pidreuse_rc"
[ "$molecule_rc" = 0 ] || [ "$molecule_rc" = 5 ] || exit "$molecule_rc"
