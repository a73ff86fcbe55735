#!/usr/bin/env bash
# Installs the Debian (bookworm) packages sluice builds and tests with.
# Quiet no-op when they are all present; needs root.
#   --vm  also what vagrant/run-local.sh needs: QEMU, a static busybox, kmod,
#         and Debian's Linux 6.1 kernel package, downloaded (not installed)
#         into /var/cache/sluice-vm (SLUICE_VM_CACHE overrides).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config clang llvm libbpf-dev bpftool
      libelf-dev zlib1g-dev libnl-3-dev libnl-route-3-dev libspdlog-dev libfmt-dev
      nlohmann-json3-dev libgtest-dev iproute2 iptables python3 util-linux)
# sluice-cni's netns tests run the real bridge / host-local plugins; the
# deploy/ test parses the manifest with python3-yaml.
PKGS+=(containernetworking-plugins python3-yaml)
# The agent's Kubernetes client (userspace/agent/kube) speaks HTTPS through
# libcurl; the test API server (test/apiserver) makes its CA and certificate
# per run with the openssl CLI.
PKGS+=(libcurl4-openssl-dev openssl)
VM=0
if [ "${1:-}" = "--vm" ]; then
  VM=1
  PKGS+=(qemu-system-x86 busybox-static kmod)
fi
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
updated=0
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  updated=1
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$VM" -eq 1 ] || exit 0

# The guest kernel: the version linux-image-amd64 points at, as a package
# file only (dpkg-deb -x unpacks it; nothing is installed on this host).
CACHE="${SLUICE_VM_CACHE:-/var/cache/sluice-vm}"
mkdir -p "$CACHE"
image() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-6\.1/ {print $2; exit}'; }
name="$(image)"
if [ -z "$name" ] && [ "$updated" -eq 0 ]; then
  apt-get update -qq
  name="$(image)"
fi
[ -n "$name" ] || { echo "install-deps.sh: no Debian 6.1 kernel package (linux-image-amd64) in the apt sources" >&2; exit 1; }
name="$name-unsigned"
version="$(apt-cache policy "$name" | awk '/Candidate:/ {print $2}')"
if ! ls "$CACHE/${name}_${version}_amd64.deb" >/dev/null 2>&1; then
  echo "downloading $name $version into $CACHE"
  # apt's download sandbox user cannot write a root-owned cache: say so.
  (cd "$CACHE" && apt-get download -q "$name" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  ls "$CACHE/${name}_${version}_amd64.deb" >/dev/null
fi
