#!/usr/bin/env bash
# `sluicectl pod add` as a whole process, with and without the node side
# (--node-netns), interleaved: docs/benchmarks.md, "The node side".
#   sudo scripts/bench-pod-add.sh [SLUICECTL] [RUNS]
# Builds a node netns and one pod netns (veth pair, routed like Calico),
# then RUNS times: pod add with --node-netns, pod remove, pod add without,
# pod remove; prints median and p99 of each add in ms. Removes everything
# it made on exit.
set -euo pipefail
ctl=${1:-./build/sluicectl}
runs=${2:-200}
tag=sbpa-$$
root=/sys/fs/bpf/sluice-t-$tag
node=$tag-n pod=$tag-p
cleanup() {
  "$ctl" --bpffs "$root" --socket /nonexistent pod remove --id "$pod" >/dev/null 2>&1 || true
  ip netns del "$pod" 2>/dev/null || true
  ip netns del "$node" 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT
ip netns add "$node"; ip netns add "$pod"
ip -n "$node" link add vh0 type veth peer name eth0 netns "$pod"
ip -n "$node" link set lo up; ip -n "$node" link set vh0 up
ip -n "$pod" link set lo up; ip -n "$pod" link set eth0 up
ip -n "$pod" addr add 10.211.0.2/32 dev eth0
ip -n "$pod" addr add fd00:211::2/128 dev eth0 nodad
ip -n "$node" route add 10.211.0.2/32 dev vh0
mkdir -p "$root"
now() { date +%s%N; }
declare -a with without
for ((i = 0; i < runs; i++)); do
  t0=$(now); "$ctl" --bpffs "$root" --socket /nonexistent pod add --netns "/run/netns/$pod" --node-netns "/run/netns/$node" >/dev/null; t1=$(now)
  "$ctl" --bpffs "$root" --socket /nonexistent pod remove --id "$pod" >/dev/null
  t2=$(now); "$ctl" --bpffs "$root" --socket /nonexistent pod add --netns "/run/netns/$pod" >/dev/null; t3=$(now)
  "$ctl" --bpffs "$root" --socket /nonexistent pod remove --id "$pod" >/dev/null
  with+=($(((t1 - t0) / 1000))); without+=($(((t3 - t2) / 1000)))
done
stats() { sort -n | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.99+0.999)]; printf "median %.2f ms  p99 %.2f ms  (n=%d)\n", m/1000, p/1000, NR}'; }
echo "pod add --node-netns: $(printf '%s\n' "${with[@]}" | stats)"
echo "pod add (no node side): $(printf '%s\n' "${without[@]}" | stats)"
