#!/usr/bin/env bash
# The live demo: installs the Debian packages it needs, builds, and shows
# sluice as a node's agent: the pod is enrolled through sluiced, handed to a
# ztunnel stand-in over ZDS (which opens its listeners inside the pod from
# the netns fd it is handed, as ztunnel does), and its traffic redirected
# there without one netfilter rule. Everything happens in its own network
# namespaces and bpffs root, and is cleaned up on exit.
#
#  remote netns (10.251.0.2)   node netns (10.250.0.1)       pod netns (10.250.0.2)
#  ┌──────────────┐  veth  ┌──────────────────────┐  veth  ┌─────────────────────────────┐
#  │ client       ├────────┤ server :8080         ├────────┤ eth0  app :9090             │
#  └──────────────┘        │ prober (kubelet)     │        │ listeners :15001/6/8/53 of  │
#                          │ sluiced ◀─ZDS─ sluice-standin --zds (node proxy) ──fd──▶ │
#                          └──────────────────────┘        └─────────────────────────────┘
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "demo.sh: needs root (network namespaces, BPF); run it as root" >&2
  exit 1
fi
./scripts/install-deps.sh
./scripts/build.sh >/dev/null

NODE="sluice-demo-node-$$"
POD="sluice-demo-pod-$$"
REMOTE="sluice-demo-remote-$$"
ROOT="/sys/fs/bpf/sluice-demo-$$"
EVENTS="$(mktemp)"
RUN="$(mktemp -d)"
CTL=(./build/sluicectl --bpffs "$ROOT" --socket "$RUN/agent.sock")
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
  rm -rf "$ROOT" "$EVENTS" "$RUN"
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
step "the node agent: sluiced, serving ZDS on $RUN/ztunnel.sock"
# nsenter --net keeps this machine's mounts (ip netns exec would give the
# agent a private /sys, and its pins would die with it).
nsenter --net="/var/run/netns/$NODE" ./build/sluiced --bpffs "$ROOT" --socket "$RUN/agent.sock" \
  --metrics-address off --ztunnel-socket "$RUN/ztunnel.sock" 2>"$RUN/sluiced.log" & PIDS+=($!)
for _ in $(seq 100); do [ -S "$RUN/agent.sock" ] && break; sleep 0.1; done
echo "    $(grep -m1 'ZDS: waiting' "$RUN/sluiced.log" | sed 's/^.*\] //')"

step "the node proxy: sluice-standin --zds (a ztunnel stand-in) connects and gets its snapshot"
# Before Linux 6.6 the kernel cannot hand packets to SO_REUSEPORT listeners.
STANDIN=(./build/sluice-standin --zds "$RUN/ztunnel.sock")
if ! ./build/sluicectl status --json | python3 -c 'import json, sys; sys.exit(not json.load(sys.stdin)["reuseport_proxies"])'; then
  STANDIN+=(--no-reuseport)
fi
"${STANDIN[@]}" >"$EVENTS" 2>/dev/null & PIDS+=($!)
for _ in $(seq 50); do grep -q '"event":"snapshot"' "$EVENTS" && break; sleep 0.1; done
grep -m1 '"event":"snapshot"' "$EVENTS" | sed 's/^/    /'

step "enroll the pod through the agent: redirection, AddWorkload with the pod's netns, ack, probe SNAT"
"${CTL[@]}" pod add --netns "/var/run/netns/$POD" --node-netns "/var/run/netns/$NODE" --id demo-pod \
  --uid 6b0a3bd4-1c53-4d33-9a51-0d5a5f1c2e3d --pod-name demo --pod-namespace default --service-account demo
grep -E '"event":"(add|proxy-started)"' "$EVENTS" | sed 's/^/    /'
"${CTL[@]}" pod list
"${CTL[@]}" status | grep -E '^(node proxy|ztunnel) '

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

step "remove the pod: probe SNAT and redirection out, DelWorkload; traffic flows directly again"
"${CTL[@]}" pod remove --id demo-pod
grep -E '"event":"(del|proxy-stopped)"' "$EVENTS" | sed 's/^/    /'
ip netns exec "$POD" $PEER tcp-client 10.250.0.1 8080 "hello again"
proxy_saw
echo
echo "demo done; cleaning up"
