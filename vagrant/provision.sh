#!/usr/bin/env bash
# Vagrant provisioner: the build and test dependencies of sluice on a
# Debian/Ubuntu or Fedora box. $1: debian | fedora.
set -euo pipefail
family="$1"
case "$family" in
  debian)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends build-essential cmake ninja-build pkg-config clang llvm \
      libelf-dev zlib1g-dev libnl-3-dev libnl-route-3-dev libspdlog-dev libfmt-dev nlohmann-json3-dev \
      libgtest-dev iproute2 iptables python3 util-linux git ca-certificates make
    . /etc/os-release
    if [ "$VERSION_CODENAME" = jammy ]; then
      # Ubuntu 22.04 ships libbpf 0.5; sluice needs 1.x (Debian 12 has 1.1).
      # bpftool comes from the same sources.
      if ! pkg-config --atleast-version=1.1 libbpf 2>/dev/null; then
        rm -rf /tmp/bpftool
        git clone -q --depth 1 --branch v7.1.0 --recurse-submodules https://github.com/libbpf/bpftool /tmp/bpftool
        make -s -C /tmp/bpftool/libbpf/src install PREFIX=/usr LIBDIR=/usr/lib/x86_64-linux-gnu
        make -s -C /tmp/bpftool/src install
      fi
    else
      apt-get install -y -qq --no-install-recommends libbpf-dev
      # Debian packages bpftool on its own; Ubuntu in linux-tools.
      apt-get install -y -qq --no-install-recommends bpftool 2>/dev/null ||
        apt-get install -y -qq --no-install-recommends linux-tools-common "linux-tools-$(uname -r)"
    fi
    ;;
  fedora)
    dnf -y -q install gcc-c++ cmake ninja-build pkgconf-pkg-config clang llvm libbpf-devel bpftool \
      elfutils-libelf-devel zlib-devel libnl3-devel spdlog-devel fmt-devel json-devel gtest-devel \
      iproute iptables-nft python3 kernel-modules-extra
    dnf -y -q upgrade kernel
    ;;
  *)
    echo "provision.sh: unknown family '$family' (debian or fedora)" >&2
    exit 2
    ;;
esac
