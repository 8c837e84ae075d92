#!/usr/bin/env bash
# Prepare a Debian 12 machine (as root) to run the molecule scenarios under
# molecule/: rootful podman with runc, a containers.conf drop-in with limits
# this kernel accepts, the systemd base image built locally from Debian's
# archive, and the project's virtual environment.
#
# Idempotent: every step checks first and does nothing when already done; the
# base image is rebuilt only when its recipe (the build_rootfs function below
# and the variables it uses) changes, because the image tag is the recipe hash.
#
# Usage: scripts/setup-molecule.sh          (prints the seconds each step took)
#        scripts/setup-molecule.sh packages (the host packages only: step 1)
#        CPUPOOLS_MOLECULE_REBUILD=1 scripts/setup-molecule.sh   (force a rebuild)
# scripts/test.sh installs the packages first, then runs the rest beside the
# tests: apt-get may add system accounts, which must not happen while the
# security tests run useradd.
set -euo pipefail
cd "$(dirname "$0")/.."
only=${1:-all}
case "$only" in
    all | packages) ;;
    *)
        printf 'setup-molecule: unknown argument %s (packages, or none)\n' "$only" >&2
        exit 2
        ;;
esac

# The tag molecule/*/molecule.yml runs; re-pointed at every rebuild.
IMAGE_REPO=localhost/cpupools-molecule
IMAGE_CURRENT=$IMAGE_REPO:current
# Host packages: podman + runc (crun fails on this kernel's mixed cgroup v1/v2
# setup) and mmdebstrap to build the image without any container registry.
HOST_PACKAGES=(podman runc mmdebstrap)
DROPIN=/etc/containers/containers.conf.d/50-cpupools-molecule.conf

timings=()
step_start=0
say() { printf 'setup-molecule: %s\n' "$*" >&2; }
begin() {
    step_name=$1
    step_start=$(date +%s%N)
}
end() {
    local ms=$((($(date +%s%N) - step_start) / 1000000))
    timings+=("$(printf '%-18s %6d.%03ds %s' "$step_name" $((ms / 1000)) $((ms % 1000)) "${1:-}")")
}

if [ "$(id -u)" -ne 0 ]; then
    say "must run as root (rootful podman, apt-get, mmdebstrap)"
    exit 1
fi

# --- 1. host packages -------------------------------------------------------
begin packages
missing=()
for pkg in "${HOST_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
    end "installed ${missing[*]}"
else
    end "already installed"
fi

if [ "$only" = packages ]; then
    say "done; seconds per step:"
    printf '  %s\n' "${timings[@]}" >&2
    exit 0
fi

# --- 2. containers.conf -------------------------------------------------------
# A drop-in rather than an edit of /etc/containers/containers.conf: podman
# reads containers.conf.d/*.conf after containers.conf and overrides key by
# key, so the operator's own file stays untouched and removing this one file
# undoes the change. The default ulimits podman asks for (nofile 1048576,
# nproc 4194304) exceed this machine's hard limits and fail with EPERM; ask
# for at most 16384/32768 and never more than the hard limit we run under.
begin containers.conf
clamp() { # clamp WANT HARD
    if [ "$2" = unlimited ] || [ "$2" -ge "$1" ]; then echo "$1"; else echo "$2"; fi
}
nofile=$(clamp 16384 "$(ulimit -Hn)")
nproc=$(clamp 32768 "$(ulimit -Hu)")
want_conf="# Written by cpupools scripts/setup-molecule.sh; delete this file to undo.
[containers]
default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]

[engine]
runtime = \"runc\""
if [ "$(cat "$DROPIN" 2>/dev/null || true)" != "$want_conf" ]; then
    mkdir -p "$(dirname "$DROPIN")"
    tmp=$(mktemp "$DROPIN.XXXXXX")
    printf '%s\n' "$want_conf" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$DROPIN"
    end "wrote $DROPIN"
else
    end "unchanged"
fi
runtime=$(podman info --format '{{.Host.OCIRuntime.Name}}')
if [ "$runtime" != runc ]; then
    say "podman still uses OCI runtime '$runtime' (is CONTAINERS_CONF set, or ~/.config/containers/containers.conf overriding $DROPIN?)"
    exit 1
fi

# --- 3. base image ------------------------------------------------------------
# The recipe. Everything that shapes the image is inside this function, so its
# text (declare -f) is what the tag hashes. Writes a root filesystem tar to $1.
build_rootfs() {
    local suite=bookworm mirror=http://deb.debian.org
    # systemd as PID 1 and what Ansible and the scenarios need inside.
    local include=systemd,systemd-sysv,python3,sudo,procps,iproute2
    mmdebstrap --quiet --variant=minbase --mode=root --format=tar --include="$include" \
        --customize-hook='chroot "$1" systemctl --quiet mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer' \
        --customize-hook='chroot "$1" systemctl --quiet set-default multi-user.target' \
        "$suite" "$1" \
        "deb $mirror/debian $suite main" \
        "deb $mirror/debian $suite-updates main" \
        "deb $mirror/debian-security $suite-security main"
}
begin image
recipe_hash=$(declare -f build_rootfs | sha256sum | cut -c1-12)
image=$IMAGE_REPO:$recipe_hash
if [ -z "${CPUPOOLS_MOLECULE_REBUILD:-}" ] && podman image exists "$image"; then
    podman tag "$image" "$IMAGE_CURRENT"
    end "$image exists"
else
    workdir=$(mktemp -d /var/tmp/cpupools-molecule.XXXXXX)
    trap 'rm -rf "$workdir"' EXIT
    say "building $image (mmdebstrap $(mmdebstrap --version | cut -d' ' -f2))"
    build_rootfs "$workdir/rootfs.tar"
    podman import --quiet \
        --change 'CMD ["/sbin/init"]' \
        --change 'STOPSIGNAL SIGRTMIN+3' \
        --change "LABEL org.cpupools.recipe=$recipe_hash" \
        "$workdir/rootfs.tar" "$image" >/dev/null
    podman tag "$image" "$IMAGE_CURRENT"
    rm -rf "$workdir"
    # Drop images of older recipes (kept if a container still uses one).
    for old in $(podman images --format '{{.Repository}}:{{.Tag}}' "$IMAGE_REPO"); do
        case $old in "$image" | "$IMAGE_CURRENT") ;; *) podman rmi "$old" >/dev/null 2>&1 || say "kept $old (in use)" ;; esac
    done
    end "built $image"
fi

# --- 4. smoke test: the limits and the runtime work ---------------------------
begin smoke-run
podman run --rm --network=none "$IMAGE_CURRENT" /bin/true
end "podman run $IMAGE_CURRENT /bin/true"

# --- 5. virtual environment (molecule, ansible, the podman collection) -------
begin venv
scripts/bootstrap.sh dev
end ".venv matches requirements-dev.txt"

say "done; seconds per step:"
printf '  %s\n' "${timings[@]}" >&2
