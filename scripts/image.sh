#!/usr/bin/env bash
# `make image`: build the Sluice image (sluice:latest) with podman, or docker when podman is
# not installed. Its base is python:3.11-slim-bookworm when that is here or can be pulled; on a
# machine that reaches no container registry, a Debian bookworm base is built from Debian's
# packages (debootstrap, root) and imported, once: later builds reuse it.
#
# Environment: IMAGE (sluice:latest), CONTAINER_ENGINE (podman|docker), SLUICE_BASE_IMAGE (a
# base to use instead of either), DEBIAN_MIRROR (default: this machine's apt mirror if it is
# Debian's, else deb.debian.org), SLUICE_BUILD_CA (the CA bundle pip trusts in the build;
# default: PIP_CERT, SSL_CERT_FILE or the system's).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-sluice:latest}
DEFAULT_BASE=docker.io/library/python:3.11-slim-bookworm
LOCAL_BASE=localhost/sluice-base:bookworm
started=$(date +%s)

say() { echo "[image] $*" >&2; }
die() { say "$*"; exit 1; }

if [ -n "${CONTAINER_ENGINE:-}" ]; then
    ENGINE=$CONTAINER_ENGINE
elif command -v podman >/dev/null 2>&1; then
    ENGINE=podman
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    ENGINE=docker
else
    die "make image needs podman or docker (Debian: apt-get install podman runc debootstrap)"
fi

# One build at a time per checkout (the suite's image tests may start two): the second waits
# and then finds the base and the layers made.
mkdir -p var/image
if command -v flock >/dev/null 2>&1; then
    exec 9>var/image/build.lock
    flock 9
fi

have_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

# This machine's Debian mirror (apt's first non-security source), so the base comes from where
# the machine's own packages come from; deb.debian.org when the machine is not Debian.
apt_source() {  # apt_source security|main
    local pick=(grep -v -- -security)
    [ "$1" = security ] && pick=(grep -- -security)
    {
        grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
        grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            | sed 's/\[[^]]*\]//' | awk '{print $2}'
    } | "${pick[@]}" | head -n 1 || true
}

build_debian_base() {
    [ "$(id -u)" = 0 ] || die "building a base image from Debian packages needs root (debootstrap): run it as root, or make $DEFAULT_BASE reachable"
    command -v debootstrap >/dev/null || die "debootstrap is not installed (Debian: apt-get install debootstrap)"
    local mirror=${DEBIAN_MIRROR:-} security=${DEBIAN_SECURITY_MIRROR:-}
    if grep -qs '^ID=debian' /etc/os-release; then
        mirror=${mirror:-$(apt_source main)}
        security=${security:-$(apt_source security)}
    fi
    mirror=${mirror:-http://deb.debian.org/debian}
    security=${security:-http://deb.debian.org/debian-security}
    root=$(mktemp -d var/image/rootfs.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    say "no registry answers for $DEFAULT_BASE: building a Debian bookworm base from $mirror"
    debootstrap --variant=minbase --include=python3.11,python3-venv,ca-certificates \
        bookworm "$root" "$mirror" >var/image/debootstrap.log 2>&1 \
        || die "debootstrap failed; see var/image/debootstrap.log"
    # Like Debian's own container images: no manuals or translations, now or after upgrades.
    cat >"$root/etc/dpkg/dpkg.cfg.d/sluice-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
CFG
    cat >"$root/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
SRC
    chroot "$root" apt-get update -qq >>var/image/debootstrap.log 2>&1 \
        && chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -y -qq upgrade \
            >>var/image/debootstrap.log 2>&1 \
        || die "updating the base's packages failed; see var/image/debootstrap.log"
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log
    find "$root/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
    rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/*
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    tar -C "$root" --numeric-owner -c . \
        | "$ENGINE" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
    rm -rf "$root"
    trap - EXIT
    say "imported $LOCAL_BASE"
}

pull_default() {  # a registry that drops packets would otherwise hang the build
    local bounded=()
    if command -v timeout >/dev/null 2>&1; then bounded=(timeout 120); fi
    ${bounded[@]+"${bounded[@]}"} "$ENGINE" pull -q "$DEFAULT_BASE" >/dev/null 2>&1
}

# The base: one given, else the default if already here, else the Debian base built before,
# else the default pulled, else a Debian base built now.
if [ -n "${SLUICE_BASE_IMAGE:-}" ]; then
    BASE=$SLUICE_BASE_IMAGE
    have_image "$BASE" || "$ENGINE" pull "$BASE"
elif have_image "$DEFAULT_BASE"; then
    BASE=$DEFAULT_BASE
elif have_image "$LOCAL_BASE"; then
    BASE=$LOCAL_BASE
elif pull_default; then
    BASE=$DEFAULT_BASE
else
    build_debian_base
    BASE=$LOCAL_BASE
fi
say "base: $BASE ($ENGINE)"

# On some VMs podman's defaults (crun, systemd cgroups, raised ulimits) cannot start a
# container; scripts/podman-setup.sh switches to what can, and only when needed.
if [ "$ENGINE" = podman ] && ! podman run --rm --network=none "$BASE" true >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
        say "podman cannot start a container as configured; running scripts/podman-setup.sh"
        scripts/podman-setup.sh >&2
    fi
    podman run --rm --network=none "$BASE" true \
        || die "podman cannot start a container here (see scripts/podman-setup.sh)"
fi

# pip in the build trusts what this machine trusts (its CA bundle, passed as a build secret so
# it is not kept in the image): behind a TLS-inspecting proxy PyPI is otherwise unreachable.
ca=${SLUICE_BUILD_CA:-${PIP_CERT:-${SSL_CERT_FILE:-${REQUESTS_CA_BUNDLE:-}}}}
if [ -z "$ca" ] || [ ! -f "$ca" ]; then
    ca=/etc/ssl/certs/ca-certificates.crt
fi
if [ ! -f "$ca" ]; then
    mkdir -p var/image && ca=var/image/no-ca && : >"$ca"
fi
previous=$("$ENGINE" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
"$ENGINE" build --build-arg "BASE=$BASE" --secret "id=build-ca,src=$ca" \
    -f Containerfile -t "$IMAGE" .
# The image this build replaced, now untagged (kept if a container still uses it).
if [ -n "$previous" ] && [ "$previous" != "$("$ENGINE" image inspect --format '{{.Id}}' "$IMAGE")" ]; then
    "$ENGINE" rmi "$previous" >/dev/null 2>&1 || true
fi
size=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE from $BASE in $(($(date +%s) - started)) s; $((size / 1000000)) MB"
