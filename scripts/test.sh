#!/usr/bin/env bash
# The whole test suite: installs missing Debian packages, builds, runs every
# CTest label (unit, bpf, netns) as root. Extra arguments go to ctest
# (e.g. -L netns, -R Rule1).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "test.sh: the bpf and netns tests need root (run with sudo)" >&2
  exit 1
fi
./scripts/install-deps.sh
./scripts/build.sh
# Fresh nodes often have no bpffs at /sys/fs/bpf; the loader mounts it too,
# but the bpf tests create their roots before any loader runs. A bpffs we
# mounted is unmounted again at exit (with it go the kernel's own
# maps.debug/progs.debug entries that appear on every fresh bpffs).
if [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" != "bpf_fs" ]; then
  mount -t bpf bpf /sys/fs/bpf
  trap 'umount /sys/fs/bpf 2>/dev/null || true' EXIT
fi
ctest --test-dir build --output-on-failure --timeout 300 -j2 "$@"
