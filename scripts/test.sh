#!/usr/bin/env bash
# The project's test command (README, .ci/run): system packages, the virtual
# environment, lint, module docs, then every test.
#   ./scripts/test.sh            everything
#   ./scripts/test.sh -k plan    extra arguments go to pytest
#
# Only what the tests cannot start without runs first, one step after the
# other: the system packages (as root, the molecule host packages too), the
# virtual environment, ruff and yamllint (a few seconds; they fail fast). The
# rest runs beside the pytest run, which
# keeps two cores busy only ~80% of the time (measured: 1.6 CPU-seconds per
# second), each job with its output in a log shown, and its exit status
# checked, after pytest's: ansible-lint and ansible-doc, the CMK v1.4
# interleaving test, the installed collection on the older supported
# ansible-core, the real-kernel scenario in a qemu guest, and (as root) the
# molecule platform then the molecule scenarios.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

step() { printf '\n== %s\n' "$*"; }

# What the run costs, in its log: each job's CPU time (its processes and every
# child they waited for: qemu, and the modules Ansible runs in the molecule
# containers through nsenter; not the containers' own systemd and services,
# which podman's conmon starts) in a "cpu:" line at its end, and at the end the
# machine's busy CPU-seconds against its cores x the wall time. The run's
# budget (README, "Testing") is in CPU-seconds first: on two cores the jobs
# beside each other finish together only when their sum fits.
TIMEFORMAT='cpu: %U s user + %S s system in %R s'
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
# How fast this machine's CPUs are now: the CPU-seconds (not wall) of a fixed
# loop, the best of five. The same commits' suite has spent more CPU-seconds
# on its first 200 tests on a slow day than on all 1,581 on a usual one, so a
# run's figures compare only beside its speed (README, "Testing").
speed() {
    python3 -I -c 'import time
best = 1e9
for _ in range(5):
    start, total = time.process_time(), 0
    for i in range(2_000_000):
        total += i
    best = min(best, time.process_time() - start)
print(f"{best:.2f}")'
}
run_started=$SECONDS
run_ticks=$(busy_ticks)
printf 'machine speed: a fixed loop took %s CPU-seconds at the start of the run\n' "$(speed)"

step "system packages"
./scripts/setup-system.sh
step "virtual environment"
./scripts/bootstrap.sh dev
if [ "$(id -u)" = 0 ]; then
    # Only the packages: apt-get may add system accounts, which must not
    # happen while the security tests run useradd. The rest runs beside the tests.
    step "molecule platform: the host packages (podman, runc, mmdebstrap)"
    ./scripts/setup-molecule.sh packages
fi
bin=.venv/bin

# The Kubernetes tests run against a real kube-apiserver and etcd (tests/k8s_real.py),
# found as envtest finds them: KUBEBUILDER_ASSETS, else ../shared/k8s/bin beside
# the checkout. Without them those tests skip, saying so, unless
# CPUPOOLS_REQUIRE_REAL_K8S=1 (.ci/run) makes that a failure.
if [ -z "${KUBEBUILDER_ASSETS:-}" ] && [ -x ../shared/k8s/bin/kube-apiserver ]; then
    KUBEBUILDER_ASSETS="$(cd ../shared/k8s/bin && pwd)"
    export KUBEBUILDER_ASSETS
fi

step "lint: ruff"
"$bin/ruff" check .
"$bin/ruff" format --check .
step "lint: yamllint"
"$bin/yamllint" -s .

# Where the tests write their files: pytest's base directory of each job, on
# tmpfs when /dev/shm is one with room (6 GB; a whole run writes about 1 GB in
# 130,000 files). On the disk, pytest removes the trees of the runs before
# last as each session ends, and every job that ends waits for that removal:
# on a file system mounted with online discard (every freed block a
# synchronous discard, ~0.3 ms) the side jobs of one CI run ended together,
# up to ten minutes after their last test, while the trees of an earlier run
# were deleted. Here each job has its own directory (--basetemp, through
# PYTEST_ADDOPTS), nothing old is removed during the run, and the run's files
# go when it passes; after a failure they stay for a look and the next run
# removes them. The name is short: a test's directory is then shorter than
# under /tmp/pytest-of-root (ansible-core 2.21 cannot start under a TMPDIR of
# more than 75 characters, docs/collection.md). CPUPOOLS_TEST_TMP=disk keeps
# pytest's own directories.
tmp_root=
if [ "${CPUPOOLS_TEST_TMP:-}" != disk ] && [ -d /dev/shm ] && [ -w /dev/shm ] &&
    [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] &&
    [ "$(df -Pk /dev/shm | awk 'NR == 2 { print $4 }')" -gt $((6 * 1024 * 1024)) ]; then
    for old in /dev/shm/cpt.*; do
        # An earlier run's (it holds the PID of its script), unless that run is still going.
        owner=$(cat "$old/.run" 2>/dev/null || true)
        if [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; then
            rm -rf "$old"
        fi
    done
    tmp_root=$(mktemp -d /dev/shm/cpt.XXXXXX)
    echo $$ >"$tmp_root/.run"
    # The tests run programs they write (stand-ins, a node's /opt/bin/cmk): not on a noexec mount.
    printf '#!/bin/sh\n' >"$tmp_root/.exec" && chmod 700 "$tmp_root/.exec"
    if ! "$tmp_root/.exec" 2>/dev/null; then
        rm -rf "$tmp_root"
        tmp_root=
    fi
fi
# addopts JOB: PYTEST_ADDOPTS for one job, its own base directory added.
addopts() { printf '%s' "${PYTEST_ADDOPTS:-}${tmp_root:+ --basetemp=$tmp_root/$1}"; }

# The CMK v1.4 interleaving test forces PID reuse through ns_last_pid. In a PID
# namespace of its own, with its own /proc, it moves only that namespace's
# counter, so it runs beside the other tests; scripts/pidns_init.py is the
# namespace's PID 1 (it reaps the orphans a killed agent leaves, which would
# otherwise stay zombies and look alive). Where unshare cannot make a PID
# namespace (no CAP_SYS_ADMIN), it runs as before: alone, first, in the
# machine's namespace, where it would reuse the PIDs of other tests.
pidreuse=(env PYTEST_ADDOPTS="$(addopts pidreuse)" "$bin/python" -m pytest -p no:xdist -m pidreuse -rs "$@")
pidreuse_in_namespace=
if unshare --pid --fork --mount-proc true 2>/dev/null; then
    pidreuse_in_namespace=1
else
    step "CMK v1.4 interleaving (alone: unshare cannot make a PID namespace here, and it moves the PID counter)"
    rc=0
    "${pidreuse[@]}" || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
fi

# Jobs beside the pytest run: beside NAME COMMAND... starts one; finish NAME
# TITLE OK waits for it and shows its log, and keeps in failed its exit status
# unless it is one of OK (pytest's 5 is "nothing selected": a -k filter that
# matches none of the job's tests).
declare -A job_pid job_log
jobs_beside=()
failed=0
beside() {
    local name=$1
    shift
    job_log[$name]=$(mktemp)
    { time "$@"; } >"${job_log[$name]}" 2>&1 &
    job_pid[$name]=$!
    jobs_beside+=("$name")
}
finish() {
    local name=$1 title=$2 ok=" $3 " status=0
    [ -n "${job_pid[$name]:-}" ] || return 0
    wait "${job_pid[$name]}" || status=$?
    step "$title (ran beside the tests above; exit status $status)"
    cat "${job_log[$name]}"
    rm -f "${job_log[$name]}"
    if [[ $ok != *" $status "* ]] && [ "$failed" = 0 ]; then
        failed=$status
    fi
}

lint_job() {
    printf '== lint: ansible-lint (production profile)\n'
    PATH="$PWD/$bin:$PATH" "$bin/ansible-lint" --offline -q || return
    printf '== module docs: ansible-doc\n'
    local module name
    for module in plugins/modules/*.py; do
        name=$(basename "$module" .py)
        "$bin/ansible-doc" -t module "$name" >/dev/null || { echo "ansible-doc cannot render $name" >&2; return 1; }
        echo "ok: $name"
    done
}
beside lint lint_job
if [ -n "$pidreuse_in_namespace" ]; then
    beside pidreuse unshare --pid --fork --mount-proc "$bin/python" scripts/pidns_init.py "${pidreuse[@]}"
fi

# The molecule scenarios run one at a time (each boots a systemd container): a
# scenario mostly waits on its container, and beside the pytest run they take
# the time of the longer rather than the sum. As root, the rest of the molecule
# platform (the containers.conf drop-in, the systemd base image: mmdebstrap,
# minutes on a fresh machine) is set up first, in the same job; nothing else
# needs it.
# Nothing a scenario writes is in the checkout (its report goes to its own
# ephemeral directory).
# The kubelet scenario runs by hand (tests/test_molecule.py BY_HAND): the
# real-kubelet guest below runs its rollout on a real systemd and kubelet.
molecule_job() {
    if [ "$(id -u)" = 0 ]; then
        printf '== molecule platform: containers.conf, the systemd base image\n'
        ./scripts/setup-molecule.sh || return
        printf '== molecule scenarios\n'
    fi
    PYTEST_ADDOPTS=$(addopts molecule) "$bin/python" -m pytest -p no:xdist -m "molecule and not molecule_by_hand" -rs --durations=0 "$@"
}
beside molecule molecule_job "$@"

# The real-kernel scenario (tests/guest/test_real_kubelet.py): a Debian 13 guest
# under qemu (TCG) as the node, with the real kubelet joined to a real control
# plane: the kubelet runtime end to end (a drained reboot, pods pinned, verify
# with oslat, a re-run that changes nothing; its resize, refused drop-in,
# uninstall and cmk steps by hand: CPUPOOLS_GUEST_ALL=1, docs/guest.md). Its image is
# built once per machine (cached under ~/.cache/cpupools/guest). The Debian 12
# guest of tests/guest/test_real_kernel.py (cmk's own kernel arguments booted
# and verified) runs by hand (-m bookworm_guest): a second emulated guest, or a
# third reboot of this one, cost CI more than its two cores can give
# (docs/guest.md). Without qemu the scenario is skipped, saying so, unless
# CPUPOOLS_REQUIRE_GUEST=1 (.ci/run) makes that a failure.
#
# It is the longest chain of the run (each step waits on the one before, in an
# emulated machine), so it comes first for the CPU: it runs in a session of its
# own whose autogroup has nice -5 (root only; the image build needs root
# anyway), and qemu, the Ansible runs that drive the guest and the test share
# it. The kernel's autogroups (/proc/sys/kernel/sched_autogroup_enabled) share
# the CPU between sessions first; a nice value counts only within a session.
# -5 is three times the weight of the suite's session or of a molecule
# container's, about what the guest asks for while it works (one busy vCPU and
# the kubelet's loops). With qemu in a session of its own at the suite's weight
# it got a third of the two cores, each guest step took 3-5x its time alone
# and the run 87 minutes; at -10 the guest's boots and oslat's busy loops
# starved the suite (docs/guest.md).
guest_session=$(mktemp)
guest_job() {
    # shellcheck disable=SC2016 # $0 and $$ are the new session's shell's
    PYTEST_ADDOPTS=$(addopts guest) setsid --wait sh -c 'echo $$ >"$0"; echo -5 2>/dev/null >/proc/self/autogroup; exec "$@"' \
        "$guest_session" "$bin/python" -m pytest -p no:xdist -m kubelet_guest -rs --durations=0 "$@"
}
beside guest guest_job "$@"

# The rest of meta/runtime.yml's requires_ansible: the installed collection,
# read-only, on its lower bound (2.19.4) and on the newest 2.20, each in a venv
# the test makes (the suite runs on the pin, 2.21); and the node side (site.yml's
# modules, the cmk agent) on each Python 3.9-3.13 found here. Mostly waiting on
# ansible-playbook.
beside compat_core env PYTEST_ADDOPTS="$(addopts compat_core)" "$bin/python" -m pytest -p no:xdist -m compat_core -rs --durations=0 "$@"

# The guest's job is a session of its own, which an interrupt of this script
# does not reach: end it with the script.
trap 'sid=$(cat "$guest_session" 2>/dev/null); [ -z "$sid" ] || pkill -TERM -s "$sid"; exit 130' INT TERM

# xdist's default scheduling hands each worker a first block of a quarter of its share of
# consecutive tests: the first worker got every test of LONGEST (tests/conftest.py),
# and at the end the other had nothing left while it worked through them (994 idle
# CPU-seconds of 6,752). --maxschedchunk 1 keeps two tests queued per worker and hands
# out the rest one at a time, in LONGEST's order, to whichever worker is free.
step "tests (beside them, in the background: ${jobs_beside[*]})"
rc=0
{ time PYTEST_ADDOPTS=$(addopts suite) "$bin/python" -m pytest -n "${CPUPOOLS_TEST_JOBS:-2}" --maxschedchunk 1 -m "not molecule and not pidreuse and not compat_core and not guest" --durations=30 "$@"; } || rc=$?

finish lint "lint: ansible-lint, module docs: ansible-doc" "0"
finish pidreuse "CMK v1.4 interleaving, in a PID namespace of its own" "0 5"
finish compat_core "the installed collection on ansible-core 2.19.4 and 2.20, the node side on Python 3.9-3.13" "0 5"
finish molecule "molecule platform and scenarios" "0 5"
finish guest "the real-kernel scenario in a qemu guest (Debian 13: the real kubelet)" "0 5"
rm -f "$guest_session"
step "cost"
printf 'machine speed: the fixed loop took %s CPU-seconds at the end of the run\n' "$(speed)"
awk -v busy="$(($(busy_ticks) - run_ticks))" -v hz="$(getconf CLK_TCK)" -v wall="$((SECONDS - run_started))" -v cores="$(nproc)" \
    'BEGIN { printf "the machine: %d CPU-seconds busy in %d s of wall time (%d cores: %d available)\n", busy / hz, wall, cores, wall * cores }'
if [ -n "$tmp_root" ]; then
    if [ "$rc" = 0 ] && [ "$failed" = 0 ]; then
        rm -rf "$tmp_root"
    else
        printf "the tests' files: %s (removed by the next run)\n" "$tmp_root"
    fi
fi
[ "$rc" = 0 ] || exit "$rc"
exit "$failed"
