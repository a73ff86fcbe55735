#!/usr/bin/env bash
# Vagrant provisioner: builds /sluice into /root/sluice-build and runs the
# tests as root. $1: the kernel line this box stands for (printed), $2:
# ctest's arguments (split on spaces). Exit code: ctest's.
set -euo pipefail
expect="$1"
ctest_args="$2"
echo "== sluice on $(uname -r) (the $expect line)"
cmake -S /sluice -B /root/sluice-build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build /root/sluice-build
if [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" != "bpf_fs" ]; then
  mount -t bpf bpf /sys/fs/bpf
fi
/root/sluice-build/sluicectl status
start=$(date +%s)
# shellcheck disable=SC2086  # split on spaces by design
ctest --test-dir /root/sluice-build --output-on-failure --timeout 300 -j2 $ctest_args
echo "== $(uname -r): tests passed in $(($(date +%s) - start))s"
