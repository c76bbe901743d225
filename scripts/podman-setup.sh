#!/usr/bin/env bash
# Make podman run containers on a Debian VM where crun cannot: use runc with cgroupfs and no
# default ulimits (hybrid cgroups, and no CAP_SYS_RESOURCE to raise limits). `make image` runs
# this only when a container of the base image does not start as podman is configured.
# Idempotent. Needs root and Debian's packages.
set -euo pipefail
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  apt-get update -qq && apt-get install -y -qq podman runc >/dev/null
fi
mkdir -p /etc/containers
conf=/etc/containers/containers.conf
if ! grep -q 'runtime = "runc"' "$conf" 2>/dev/null; then
  # An operator's own settings are kept beside, not lost.
  if [ -s "$conf" ]; then cp "$conf" "$conf.before-sluice"; fi
  cat > "$conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
fi
podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}'
