#!/usr/bin/env python3
"""Self-test of scripts/check-layers: a tiny tree with a two-file cycle and
an upward include must fail naming both; a clean tree must pass. The temp
trees are removed whatever happens (TemporaryDirectory)."""

import os
import subprocess
import sys
import tempfile


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def run(script, root):
    p = subprocess.run([sys.executable, script, "--root", root], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def clean_tree(root):
    write(root, "maps/sluice_maps.h", "#pragma once\n")
    write(root, "base/result.h", '#pragma once\n#include "maps/sluice_maps.h"\n')
    write(root, "bpf/lib/parse.h", '#pragma once\n#include "maps/sluice_maps.h"\n')
    write(root, "bpf/pod_tc.bpf.c", '#include "lib/parse.h"\n')
    write(root, "loader/a.h", '#pragma once\n#include "base/result.h"\n')
    write(root, "loader/a.cpp", '#include "loader/a.h"\n#include "pod_tc.skel.h"\n')
    write(root, "userspace/cni/cni.cpp", '#include "base/result.h"\n')


def main():
    script = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="check-layers-") as root:
        clean_tree(root)
        code, out = run(script, root)
        if code != 0:
            failures.append(f"clean tree: exit {code}, want 0:\n{out}")
    with tempfile.TemporaryDirectory(prefix="check-layers-") as root:
        clean_tree(root)
        # A two-file cycle (through their sources) and an upward include.
        write(root, "loader/b.h", '#pragma once\n')
        write(root, "loader/b.cpp", '#include "loader/b.h"\n#include "loader/c.h"\n')
        write(root, "loader/c.h", '#pragma once\n')
        write(root, "loader/c.cpp", '#include "loader/c.h"\n#include "loader/b.h"\n')
        write(root, "base/up.cpp", '#include "loader/a.h"\n')
        code, out = run(script, root)
        if code != 1:
            failures.append(f"bad tree: exit {code}, want 1:\n{out}")
        if "cycle: loader/b -> loader/c -> loader/b" not in out:
            failures.append(f"bad tree: the cycle is not named:\n{out}")
        if "layer: base/up.cpp:1 includes loader/a.h" not in out:
            failures.append(f"bad tree: the upward include is not named:\n{out}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("check-layers self-test: ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
