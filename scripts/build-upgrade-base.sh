#!/usr/bin/env bash
# Builds the oldest release this tree must upgrade from (test/upgrade/
# oldest-supported: a tag and its commit) into build/upgrade/<tag>/:
# its sluiced and sluicectl. The upgrade tests (test/netns/upgrade_test.cpp)
# enroll pods with them, then start this tree's agent on the same pinned
# state. The sources come from this repository's history (git archive), so
# nothing is downloaded; a build that is already there is kept.
#   usage: scripts/build-upgrade-base.sh [BUILD_DIR]   (default ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="$(mkdir -p "${1:-build}" && cd "${1:-build}" && pwd)"
read -r TAG SHA < test/upgrade/oldest-supported
OUT="$BUILD/upgrade/$TAG"
if [ -x "$OUT/sluiced" ] && [ -x "$OUT/sluicectl" ] && [ "$(cat "$OUT/.commit" 2>/dev/null)" = "$SHA" ]; then
  exit 0
fi
# The tag when the clone has it (it must name the recorded commit), else the
# commit itself: a clone without tags still has the history.
if rev=$(git rev-parse -q --verify "refs/tags/$TAG^{commit}" 2>/dev/null); then
  [ "$rev" = "$SHA" ] || { echo "build-upgrade-base.sh: tag $TAG is $rev, test/upgrade/oldest-supported says $SHA" >&2; exit 1; }
elif ! git cat-file -e "$SHA^{commit}" 2>/dev/null; then
  echo "build-upgrade-base.sh: this clone has neither tag $TAG nor commit $SHA (a shallow clone?): fetch the history (git fetch --unshallow --tags)" >&2
  exit 1
fi
echo "building $TAG ($SHA) for the upgrade tests into $OUT"
rm -rf "$OUT"
mkdir -p "$OUT/src"
git archive --format=tar "$SHA" | tar -x -C "$OUT/src"
cmake -S "$OUT/src" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF >/dev/null
cmake --build "$OUT/build" --target sluiced sluicectl >/dev/null
cp "$OUT/build/sluiced" "$OUT/build/sluicectl" "$OUT/"
rm -rf "$OUT/build" "$OUT/src"
echo "$SHA" > "$OUT/.commit"
