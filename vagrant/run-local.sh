#!/usr/bin/env bash
# Runs sluice's bpf and netns tests on Debian's Linux 6.1 kernel under QEMU,
# with no Vagrant box and no disk image: the guest boots Debian's
# linux-image-6.1 with a tiny busybox initramfs, mounts this machine's root
# filesystem read-only over 9p (a tmpfs overlay takes the writes), and runs
# the tests of an existing build directory (default: ./build). The exit code
# is the tests' exit code (124: the VM timed out; 125: the VM did not report
# a result, e.g. it failed to boot).
#
#   host                                   guest (6.1, TCG or KVM)
#   /  ──9p, read-only (hostroot)──▶  /  = overlay(9p lower, tmpfs upper)
#   $work/out ◀──9p, read-write (out)──  /run/sluice-vm: rc, ctest log
#   console  ◀──ttyS0──────────────────  kernel + test output
#
# Needs root (the guest's tests run as root on a view of this filesystem)
# and the packages of `scripts/install-deps.sh --vm` (qemu-system-x86,
# busybox-static, kmod, and the kernel package, downloaded into the cache).
#
# usage: vagrant/run-local.sh [--build DIR] [--cache DIR] [--timeout SEC]
#                             [--mem MB] [--smp N] [--suites "bpf netns"]
#                             [--gtest-filter PATTERN] [--ctest "ARGS"]
#                             [--shell COMMAND]
#   --suites        test binaries to run, one process each (default: bpf netns)
#   --gtest-filter  GoogleTest filter for them (default: all, *)
#   --ctest         run ctest with ARGS (split on spaces) instead, e.g.
#                   --ctest "-L bpf|netns" (one process per test case: slow)
#   --shell         run COMMAND (bash) in the guest instead of the tests
# Environment: SLUICE_VM_ACCEL=kvm|tcg|auto (default auto: KVM when
# /dev/kvm is usable and its guest boots, else TCG emulation).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$ROOT/build"
CACHE="${SLUICE_VM_CACHE:-/var/cache/sluice-vm}"
TIMEOUT=5400
MEM=3072
SMP=2
SUITES="bpf netns"
GTEST_FILTER="*"
CTEST_ARGS=""
SHELL_CMD=""

die() { echo "run-local.sh: $*" >&2; exit 125; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$(cd "$2" && pwd)"; shift 2 ;;
    --cache) CACHE="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --mem) MEM="$2"; shift 2 ;;
    --smp) SMP="$2"; shift 2 ;;
    --suites) SUITES="$2"; shift 2 ;;
    --gtest-filter) GTEST_FILTER="$2"; shift 2 ;;
    --ctest) CTEST_ARGS="$2"; shift 2 ;;
    --shell) SHELL_CMD="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "needs root (the tests in the guest run as root)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: run scripts/install-deps.sh --vm"
command -v depmod >/dev/null || die "depmod missing (kmod): run scripts/install-deps.sh --vm"
file_is_static() { ! ldd "$1" >/dev/null 2>&1; }
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] && file_is_static "$BUSYBOX" || die "a static /bin/busybox is needed (busybox-static): run scripts/install-deps.sh --vm"
[ -x "$BUILD/sluicectl" ] && [ -x "$BUILD/test/sluice_netns_tests" ] || die "no build in $BUILD: run scripts/build.sh first"
DEB="$(ls "$CACHE"/linux-image-6.1.*-amd64-unsigned_*_amd64.deb 2>/dev/null | sort -V | tail -1 || true)"
[ -n "$DEB" ] || die "no Debian 6.1 kernel package in $CACHE: run scripts/install-deps.sh --vm"

# The kernel and its modules, unpacked once per package version.
KDIR="$CACHE/$(basename "$DEB" .deb)"
if [ ! -f "$KDIR/.unpacked" ]; then
  rm -rf "$KDIR"
  mkdir -p "$KDIR"
  dpkg-deb -x "$DEB" "$KDIR"
  touch "$KDIR/.unpacked"
fi
KVER="$(ls "$KDIR/lib/modules")"
MODDIR="$KDIR/lib/modules/$KVER"
# The package's maintainer scripts (not run by dpkg-deb -x) would run depmod:
# the guest's modprobe (and the kernel's module autoload) need modules.dep.
[ -f "$MODDIR/modules.dep" ] || depmod -b "$KDIR" "$KVER"

work="$(mktemp -d /tmp/sluice-vm.XXXXXX)"
qemu_pid=""
cleanup() {
  if [ -n "$qemu_pid" ]; then kill "$qemu_pid" 2>/dev/null || true; wait "$qemu_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Initramfs: busybox, the modules needed to mount the root (virtio PCI, 9p,
# overlay) in dependency order, and the init script.
mkdir -p "$work/initramfs/bin" "$work/initramfs/modules" "$work/out"
cp "$BUSYBOX" "$work/initramfs/bin/busybox"
cp "$ROOT/vagrant/local/init" "$work/initramfs/init"
chmod 755 "$work/initramfs/init"
declare -A seen=()
add_module() {  # $1: path relative to MODDIR; dependencies first
  local m="$1" deps d
  [ -n "${seen[$m]:-}" ] && return 0
  seen[$m]=1
  deps="$(grep "^$m:" "$MODDIR/modules.dep" | cut -d: -f2)"
  for d in $deps; do add_module "$d"; done
  cp "$MODDIR/$m" "$work/initramfs/modules/"
  basename "$m" >>"$work/initramfs/modules/order"
}
for name in virtio_pci 9pnet_virtio 9p overlay; do
  path="$(grep -o "^[^:]*/$name\.ko[^:]*" "$MODDIR/modules.dep" | head -1)"
  [ -n "$path" ] || die "module $name not found in $DEB"
  add_module "$path"
done
(cd "$work/initramfs" && find . | "$BUSYBOX" cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initramfs.cpio.gz")

# What the guest runs after switching to the shared root.
cat >"$work/out/env" <<EOF
SLUICE_SRC='$ROOT'
SLUICE_BUILD='$BUILD'
SLUICE_MODULES='$KDIR/lib/modules'
SLUICE_SUITES='$SUITES'
SLUICE_GTEST_FILTER='$GTEST_FILTER'
SLUICE_CTEST_ARGS='$CTEST_ARGS'
SLUICE_NETNS_SHARDS='${SLUICE_NETNS_SHARDS:-2}'
EOF
if [ -n "$SHELL_CMD" ]; then printf '%s\n' "$SHELL_CMD" >"$work/out/shell.sh"; fi
cp "$ROOT/vagrant/local/guest.sh" "$work/out/guest.sh"

# A guest whose CPUs lock up stops, with every CPU's stack on the console,
# instead of spinning until the run's timeout (once seen on the 6.1 guest
# under emulation: both vCPUs stuck in the kernel for minutes). Under
# emulation a vCPU also stalls for tens of seconds and recovers (seen: 26 s
# in kmem_cache_alloc while the other patched kernel text, int3 and all,
# for podman's cgroup mkdir), so a lockup counts only after 120 s (the
# kernel's soft-lockup limit is twice watchdog_thresh, at most 60).
LOCKUP_ARGS="softlockup_panic=1 softlockup_all_cpu_backtrace=1 watchdog_thresh=60"

# Boots the guest with accelerator $1; $2: seconds to wait for the
# initramfs to speak (0: no limit). Returns 3 when it stayed silent.
boot() {
  local accel="$1" watchdog="$2" args
  case "$accel" in
    kvm) args=(-accel kvm -cpu host) ;;
    tcg) args=(-accel tcg,thread=multi -cpu max) ;;
  esac
  echo "run-local.sh: booting $KVER ($accel, $SMP cpus, ${MEM} MiB), build $BUILD"
  echo "$accel" >"$work/out/accel"
  : >"$work/console.log"
  qemu-system-x86_64 -nodefaults -no-reboot -display none -monitor none \
    "${args[@]}" -smp "$SMP" -m "$MEM" \
    -kernel "$KDIR/boot/vmlinuz-$KVER" -initrd "$work/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 loglevel=5 mitigations=off $LOCKUP_ARGS" \
    -serial stdio \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs local,path="$work/out",mount_tag=out,security_model=none,multidevs=remap \
    </dev/null >"$work/console.log" 2>&1 &
  qemu_pid=$!
  tail -n +1 -f --pid="$qemu_pid" "$work/console.log" &
  local tail_pid=$! t0 status=0
  t0=$(date +%s)
  while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ $(($(date +%s) - start)) -ge "$TIMEOUT" ]; then
      status=124
      break
    fi
    if [ "$watchdog" -gt 0 ] && [ $(($(date +%s) - t0)) -ge "$watchdog" ] &&
      ! grep -q "sluice-vm: initramfs" "$work/console.log"; then
      status=3
      break
    fi
    sleep 1
  done
  # A KVM guest that QEMU gave up on before the initramfs spoke (some hosts
  # refuse a model-specific register: "failed to set MSR", an abort) is
  # the same case as a silent one.
  if [ "$status" -eq 0 ] && [ "$watchdog" -gt 0 ] && ! grep -q "sluice-vm: initramfs" "$work/console.log"; then
    status=3
  fi
  kill "$qemu_pid" 2>/dev/null || true
  wait "$qemu_pid" 2>/dev/null || true
  qemu_pid=""
  wait "$tail_pid" 2>/dev/null || true
  return "$status"
}

# KVM where it is usable: some hosts expose /dev/kvm but their KVM guests
# hang in the firmware or QEMU aborts them at once, so a KVM guest that is
# silent for 60 s or stops before its initramfs speaks is dropped for
# emulation (TCG), which always works, only slower.
accel="${SLUICE_VM_ACCEL:-auto}"
case "$accel" in
  auto|kvm|tcg) ;;
  *) die "SLUICE_VM_ACCEL must be kvm, tcg or auto" ;;
esac
start=$(date +%s)
status=0
if [ "$accel" != tcg ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
  boot kvm "$([ "$accel" = auto ] && echo 60 || echo 0)" || status=$?
  if [ "$status" -eq 3 ]; then
    echo "run-local.sh: the KVM guest stopped or said nothing in 60s; emulating instead (TCG)"
    status=0
    boot tcg 0 || status=$?
  fi
elif [ "$accel" = kvm ]; then
  die "SLUICE_VM_ACCEL=kvm, but /dev/kvm is not usable"
else
  boot tcg 0 || status=$?
fi
elapsed=$(($(date +%s) - start))
# What sharded suites had printed so far (guest.sh prints a shard's output
# only when it ends).
print_shards_so_far() {
  for f in "$work"/out/*-[0-9].log; do
    [ -f "$f" ] && { echo "run-local.sh: ${f##*/} so far:"; cat "$f"; }
  done
}
if [ "$status" -eq 124 ]; then
  print_shards_so_far
  echo "run-local.sh: the VM did not finish within ${TIMEOUT}s" >&2
  exit 124
fi
if [ ! -f "$work/out/rc" ]; then
  print_shards_so_far
  echo "run-local.sh: the VM stopped without reporting a result after ${elapsed}s (see the console above)" >&2
  exit 125
fi
rc="$(cat "$work/out/rc")"
[ -f "$work/out/summary" ] && sed 's/^/run-local.sh: /' "$work/out/summary"
userspace="$(cat "$work/out/boot-seconds" 2>/dev/null || echo '?')"
echo "run-local.sh: kernel $KVER, guest userspace after ${userspace}s, finished in ${elapsed}s, exit code $rc"
exit "$rc"
