#!/usr/bin/env bash
# Run the main job: ansible-playbook site.yml, on the embedded default
# inventory unless -i is given. Extra arguments go to ansible-playbook
# (--check --diff, --tags plan, -i inventories/sample/hosts.yml, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh run
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
# ansible-core 2.21 starts an RPC server on a UNIX socket under $TMPDIR
# ($TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX). Under a TMPDIR longer than 75
# characters that path is longer than a socket address may be (107 bytes),
# and ansible-playbook stops before its first task: "Local RPC server did not
# start" (docs/collection.md).
tmp=${TMPDIR:-/tmp}
if [ "${#tmp}" -gt 75 ]; then
    echo "run.sh: TMPDIR is ${#tmp} characters long, more than ansible-core 2.21 can start under (75): using /tmp" >&2
    export TMPDIR=/tmp
fi
exec .venv/bin/ansible-playbook site.yml "$@"
