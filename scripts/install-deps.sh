#!/usr/bin/env bash
# Installs the Debian (bookworm) packages sluice builds and tests with.
# Quiet no-op when they are all present; needs root.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config clang llvm libbpf-dev bpftool
      libelf-dev zlib1g-dev libnl-3-dev libnl-route-3-dev libspdlog-dev libfmt-dev
      nlohmann-json3-dev libgtest-dev iproute2 iptables python3 util-linux)
# sluice-cni's netns tests run the real bridge / host-local plugins; the
# deploy/ test parses the manifest with python3-yaml.
PKGS+=(containernetworking-plugins python3-yaml)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
