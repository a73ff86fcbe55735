#!/usr/bin/env bash
# Configures and builds sluice into ./build (binaries: build/sluicectl,
# build/sluice-standin; tests under build/test).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build
