#!/usr/bin/env bash
# Install the Debian packages the tests need, idempotently: nothing is
# downloaded when every package is already installed. Needs root; without it,
# says what is missing and the tests that need it are skipped.
set -euo pipefail
packages=(
    python3-venv     # the virtual environment
    util-linux       # unshare, for the real grub-mkconfig run
    grub2-common     # grub-mkconfig, update-grub
    grub-pc-bin      # grub's i386-pc files that grub-mkconfig reads
    chromium         # renders the HTML report in a real browser
    strace           # kills the agent at every system call (tests/agent/test_agent_faults.py)
    passwd           # useradd/userdel: the real accounts of the agent security tests
    # The real-kernel guest (tests/guest/): a Debian image made with mmdebstrap,
    # partitioned with sfdisk, booted under qemu (TCG), reached over SSH.
    qemu-system-x86
    qemu-utils
    mmdebstrap
    fdisk
    e2fsprogs
    openssh-client
)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "system packages: all present"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "system packages missing (run as root to install): ${missing[*]}" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600 -qq)
apt-get "${apt_opts[@]}" update
apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
echo "system packages: installed ${missing[*]}"
