#!/usr/bin/env bash
# `sluicectl pod add --node-netns` as a whole process, several builds
# interleaved (docs/benchmarks.md, "The node side"):
#   sudo scripts/bench-pod-add.sh RUNS SLUICECTL...
# A SLUICECTL given as nonode:PATH runs without --node-netns (the pod's
# host-side veth is then looked for in the caller's netns, found nowhere:
# no node side), for comparison.
# Builds a node netns and one pod netns (a veth pair routed like Calico:
# the node's side has no address, a /32 and a /128 route to the pod), gives
# each SLUICECTL its own bpffs root, and then RUNS times, for each in turn:
# pod add --node-netns (timed), pod remove (timed). Prints median and p99 in
# ms per build. Removes everything it made on exit.
set -euo pipefail
runs=$1
shift
tag=sbpa-$$
node=$tag-n pod=$tag-p
cleanup() {
  for ((b = 0; b < ${#bins[@]}; b++)); do
    "${bins[b]}" --bpffs "/sys/fs/bpf/sluice-t-$tag-$b" --socket /nonexistent pod remove --id "$pod" >/dev/null 2>&1 || true
  done
  ip netns del "$pod" 2>/dev/null || true
  ip netns del "$node" 2>/dev/null || true
  for ((b = 0; b < ${#bins[@]}; b++)); do rm -rf "/sys/fs/bpf/sluice-t-$tag-$b"; done
}
bins=() nodeArgs=()
for a in "$@"; do
  if [[ $a == nonode:* ]]; then bins+=("${a#nonode:}"); nodeArgs+=(""); else bins+=("$a"); nodeArgs+=("--node-netns /run/netns/$tag-n"); fi
done
trap cleanup EXIT
ip netns add "$node"; ip netns add "$pod"
ip -n "$node" link add vh0 type veth peer name eth0 netns "$pod"
ip -n "$node" link set lo up; ip -n "$node" link set vh0 up
ip -n "$pod" link set lo up; ip -n "$pod" link set eth0 up
ip -n "$pod" addr add 10.211.0.2/32 dev eth0
ip -n "$pod" addr add fd00:211::2/128 dev eth0 nodad
ip -n "$node" route add 10.211.0.2/32 dev vh0
ip -n "$node" route add fd00:211::2/128 dev vh0
now() { date +%s%N; }
declare -A add rm
for ((b = 0; b < ${#bins[@]}; b++)); do
  # The first add on a root loads and pins the programs: not counted.
  "${bins[b]}" --bpffs "/sys/fs/bpf/sluice-t-$tag-$b" --socket /nonexistent pod add --netns "/run/netns/$pod" ${nodeArgs[b]} >/dev/null 2>&1
  "${bins[b]}" --bpffs "/sys/fs/bpf/sluice-t-$tag-$b" --socket /nonexistent pod remove --id "$pod" >/dev/null
done
for ((i = 0; i < runs; i++)); do
  for ((b = 0; b < ${#bins[@]}; b++)); do
    r="/sys/fs/bpf/sluice-t-$tag-$b"
    t0=$(now); "${bins[b]}" --bpffs "$r" --socket /nonexistent pod add --netns "/run/netns/$pod" ${nodeArgs[b]} >/dev/null 2>&1; t1=$(now)
    "${bins[b]}" --bpffs "$r" --socket /nonexistent pod remove --id "$pod" >/dev/null; t2=$(now)
    add[$b]+="$(((t1 - t0) / 1000)) "; rm[$b]+="$(((t2 - t1) / 1000)) "
  done
done
stats() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.99+0.999)]; printf "median %6.2f ms  p99 %6.2f ms", m/1000, p/1000}'; }
for ((b = 0; b < ${#bins[@]}; b++)); do
  side="(no node side)"; [ -n "${nodeArgs[b]}" ] && side="(node side)"
  echo "${bins[b]} $side: add $(echo "${add[$b]}" | stats);  remove $(echo "${rm[$b]}" | stats)  (n=$runs)"
done
