#!/usr/bin/env bash
# Run the main job: ansible-playbook site.yml, on the embedded default
# inventory unless -i is given. Extra arguments go to ansible-playbook
# (--check --diff, --tags plan, -i inventories/sample/hosts.yml, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh run
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
exec .venv/bin/ansible-playbook site.yml "$@"
