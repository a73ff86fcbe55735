#!/usr/bin/env bash
# Configures and builds sluice into ./build (binaries: build/sluicectl,
# build/sluiced, build/sluice-cni; with the tests, under build/test, the
# ztunnel stand-in build/sluice-standin from test/standin/, which the demo
# runs too).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build
