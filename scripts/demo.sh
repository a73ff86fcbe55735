#!/usr/bin/env bash
# The live demo: installs the Debian packages it needs, builds, and shows
# sluice redirecting a pod's traffic to a ztunnel stand-in, without one
# netfilter rule. Everything happens in its own network namespaces and
# bpffs root, and is cleaned up on exit.
#
#  remote netns (10.251.0.2)   node netns (10.250.0.1)       pod netns (10.250.0.2)
#  ┌──────────────┐  veth  ┌──────────────────────┐  veth  ┌─────────────────────────────┐
#  │ client       ├────────┤ server :8080         ├────────┤ eth0  app :9090             │
#  └──────────────┘        │ prober (kubelet)     │        │ sluice-standin :15001/6/8/53│
#                          └──────────────────────┘        └─────────────────────────────┘
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "demo.sh: needs root (network namespaces, BPF); run with sudo" >&2
  exit 1
fi
./scripts/install-deps.sh
./scripts/build.sh >/dev/null

NODE="sluice-demo-node-$$"
POD="sluice-demo-pod-$$"
REMOTE="sluice-demo-remote-$$"
ROOT="/sys/fs/bpf/sluice-demo-$$"
EVENTS="$(mktemp)"
CTL=(./build/sluicectl --bpffs "$ROOT")
PIDS=()
PEER="python3 $(pwd)/scripts/demo_peer.py"

MOUNTED_BPFFS=0
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "${CTL[@]}" pod remove --id demo-pod >/dev/null 2>&1 || true
  ip netns del "$NODE" 2>/dev/null || true
  ip netns del "$POD" 2>/dev/null || true
  ip netns del "$REMOTE" 2>/dev/null || true
  rm -rf "$ROOT" "$EVENTS"
  # A bpffs the demo mounted goes again (the kernel's maps.debug/progs.debug with it).
  if [ "$MOUNTED_BPFFS" = 1 ]; then umount /sys/fs/bpf 2>/dev/null || true; fi
}
trap cleanup EXIT
if [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" != "bpf_fs" ]; then
  mount -t bpf bpf /sys/fs/bpf
  MOUNTED_BPFFS=1
fi

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
proxy_saw() {
  sleep 0.3
  local n
  n=$(grep -c listener "$EVENTS" || true)
  if [ "$n" -gt "${SEEN:-0}" ]; then
    grep listener "$EVENTS" | tail -n +"$((${SEEN:-0} + 1))" | python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    print("    proxy saw: listener %s :%s  original destination %s  from %s" % (e["listener"], e["port"], e["orig_dst"], e["peer"]))'
  else
    echo "    proxy saw: nothing"
  fi
  SEEN=$n
}

step "topology: node and pod namespaces joined by a veth pair"
ip netns add "$NODE"
ip netns add "$POD"
ip link add vethdemo netns "$NODE" type veth peer name eth0 netns "$POD"
ip -n "$NODE" link set lo up
ip -n "$POD" link set lo up
ip -n "$NODE" addr add 10.250.0.1/24 dev vethdemo
ip -n "$POD" addr add 10.250.0.2/24 dev eth0
ip -n "$NODE" link set vethdemo up
ip -n "$POD" link set eth0 up
ip -n "$POD" route add default via 10.250.0.1
ip netns add "$REMOTE"
ip link add vethremote netns "$NODE" type veth peer name eth0 netns "$REMOTE"
ip -n "$REMOTE" link set lo up
ip -n "$NODE" addr add 10.251.0.1/24 dev vethremote
ip -n "$REMOTE" addr add 10.251.0.2/24 dev eth0
ip -n "$NODE" link set vethremote up
ip -n "$REMOTE" link set eth0 up
ip -n "$REMOTE" route add default via 10.251.0.1
ip netns exec "$NODE" sysctl -qw net.ipv4.ip_forward=1
echo "    remote 10.251.0.2  <->  node 10.250.0.1 / 10.251.0.1  <->  pod 10.250.0.2"

ip netns exec "$NODE" $PEER echo-server 10.250.0.1 8080 server & PIDS+=($!)
ip netns exec "$POD" $PEER echo-server 0.0.0.0 9090 app & PIDS+=($!)
# Before Linux 6.6 the kernel cannot hand packets to SO_REUSEPORT listeners.
STANDIN=(./build/sluice-standin --netns "/var/run/netns/$POD")
if ! ./build/sluicectl status --json | python3 -c 'import json, sys; sys.exit(not json.load(sys.stdin)["reuseport_proxies"])'; then
  STANDIN+=(--no-reuseport)
fi
"${STANDIN[@]}" >"$EVENTS" & PIDS+=($!)
sleep 0.5

step "enroll the pod: sluicectl pod add"
"${CTL[@]}" pod add --netns "/var/run/netns/$POD" --node-netns "/var/run/netns/$NODE" --id demo-pod
"${CTL[@]}" pod list
echo "    netfilter rules in the pod: $(ip netns exec "$POD" iptables-save 2>/dev/null | grep -c '^-A' || true)," \
  "on the node: $(ip netns exec "$NODE" iptables-save 2>/dev/null | grep -c '^-A' || true)"

step "outbound: the pod's app connects to the node's server 10.250.0.1:8080"
ip netns exec "$POD" $PEER tcp-client 10.250.0.1 8080 "hello from the app"
proxy_saw

step "inbound: a client on another node connects to the pod's app 10.250.0.2:9090"
ip netns exec "$REMOTE" $PEER tcp-client 10.250.0.2 9090 "hello from the remote client"
proxy_saw

step "DNS: the app asks resolver 10.250.0.1:53 (a connected UDP socket)"
ip netns exec "$POD" $PEER dns-query 10.250.0.1
proxy_saw

step "bypassed: inbound to the HBONE port 15008 is not redirected"
ip netns exec "$REMOTE" $PEER tcp-client 10.250.0.2 15008 "hbone"
proxy_saw

step "kubelet probe: a socket on the node connects to the app (source becomes 169.254.7.127)"
ip netns exec "$NODE" $PEER tcp-client 10.250.0.2 9090 "probe"
proxy_saw

step "counters: sluicectl stats"
"${CTL[@]}" stats

step "inspect the maps with bpftool"
echo "    bpftool map dump pinned $ROOT/pod_config"
bpftool map dump pinned "$ROOT/pod_config" | head -20

step "remove the pod: sluicectl pod remove; traffic flows directly again"
"${CTL[@]}" pod remove --id demo-pod
ip netns exec "$POD" $PEER tcp-client 10.250.0.1 8080 "hello again"
proxy_saw
echo
echo "demo done; cleaning up"
