// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sluice's node-side programs: kubelet probe SNAT (spec rules 10 and 11),
 * the BPF counterpart of Istio's
 *   -t nat POSTROUTING -m owner --socket-exists -p tcp
 *      -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127
 * attached at the pod's host-side interface (the veth peer of its eth0,
 * whether routed or a bridge port):
 *
 *   prober (node socket) ──▶ host_egress: source -> probe addr:port ──▶ pod
 *   prober ◀── host_ingress: destination -> prober addr:port ◀── pod reply
 *
 * Only what the node sends itself is translated: a probe connection is
 * opened by a SYN of a local socket (skb->sk set), and later packets of the
 * connection follow its element, socket or not (the kernel's own answers for
 * it, see host_egress). Forwarded traffic (another node's, kube-proxy's NAT)
 * arrived on an interface and stays as it is, so the pod's proxy still
 * captures it.
 *
 * One element per translated connection, in snat_rev, keyed by the tuple
 * of its replies (pod addr:port -> probe addr:translated port); the value is
 * the prober's addr:port, the FIN flags and the pod's cookie. Both
 * directions use that one element: under LRU pressure a connection is
 * evicted whole, its two directions never part ways, and a translated port
 * is free exactly when no element holds it. host_ingress finds the element
 * with one lookup; host_egress tries the translated ports a prober's port
 * can get (snat_port: its own first, then a fixed sequence) until it finds
 * the element whose prober is the packet's source.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/nat.h"
#include "lib/verdict.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static __always_inline const __u32 *probe_addr(const struct sluice_settings *cfg, __u8 family)
{
	return family == AF_INET ? &cfg->probe_v4 : (const __u32 *)cfg->probe_v6;
}

/* The i-th translated port a prober's port can get: its own, then others
 * derived from it in the ephemeral range 1024-65535. Two probers with
 * different node addresses and the same port would otherwise collide on
 * (probe addr, port). */
static __always_inline __u16 snat_port(__u16 base, int i)
{
	return i == 0 ? base : (__u16)(1024 + (base + i * 7919) % 64512);
}

/* The element key of a connection: the reply's tuple, pod -> probe:port. */
static __always_inline void conn_key(struct sluice_snat_key *k, const struct flow *f, const __u32 *probe,
				     __be16 port)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->saddr, f->daddr, 16);
	addr_copy(k->daddr, probe, f->family);
	k->sport = f->dport;
	k->dport = port;
	k->family = f->family;
}

static __always_inline int conn_is_probers(const struct sluice_snat_value *v, const struct flow *f)
{
	return v->port == f->sport && addr_eq((const __u32 *)v->addr, f->saddr, f->family);
}

/* The element of the prober's connection (f: the prober's packet) in map,
 * its key left in k; 0 when there is none. */
static __always_inline struct sluice_snat_value *conn_find(void *map, const struct flow *f, const __u32 *probe,
							   struct sluice_snat_key *k)
{
	__u16 base = bpf_ntohs(f->sport);
	int i;

#pragma unroll
	for (i = 0; i < SLUICE_SNAT_PORT_TRIES; i++) {
		struct sluice_snat_value *v;

		conn_key(k, f, probe, bpf_htons(snat_port(base, i)));
		v = bpf_map_lookup_elem(map, k);
		if (v && conn_is_probers(v, f))
			return v;
	}
	return 0;
}

/*
 * The element of a connection whose SYN this is: a retransmitted SYN finds
 * its own (wherever it is: the port it got may not be the first free one
 * any more), a new one claims the first free translated port (BPF_NOEXIST:
 * two CPUs never get the same one). 0 when every candidate port is taken.
 */
static __always_inline struct sluice_snat_value *conn_open(const struct flow *f, const __u32 *probe, __u64 cookie,
							   struct sluice_snat_key *k, int *opened)
{
	struct sluice_snat_value *v = conn_find(&snat_rev, f, probe, k);
	struct sluice_snat_value nv = {};
	__u16 base = bpf_ntohs(f->sport);
	int i;

	if (v)
		return v;
	__builtin_memcpy(nv.addr, f->saddr, 16);
	nv.port = f->sport;
	nv.netns_cookie = cookie;
#pragma unroll
	for (i = 0; i < SLUICE_SNAT_PORT_TRIES; i++) {
		conn_key(k, f, probe, bpf_htons(snat_port(base, i)));
		if (bpf_map_lookup_elem(&snat_rev, k))
			continue;
		/* The port's earlier connection is over: its late packets
		 * would be translated to the new prober now. */
		bpf_map_delete_elem(&snat_closed, k);
		if (bpf_map_update_elem(&snat_rev, k, &nv, BPF_NOEXIST) == 0) {
			*opened = 1;
			return bpf_map_lookup_elem(&snat_rev, k);
		}
	}
	return 0;
}

/* Closed: after a RST, or the first packet without FIN once both sides
 * sent FIN (normally the last ACK). */
static __always_inline int snat_closes(__u16 flags_before, __u8 tcp_flags)
{
	return (tcp_flags & TCP_FLAG_RST) ||
	       ((flags_before & (SLUICE_SNAT_FIN_OUT | SLUICE_SNAT_FIN_IN)) ==
			(SLUICE_SNAT_FIN_OUT | SLUICE_SNAT_FIN_IN) &&
		!(tcp_flags & TCP_FLAG_FIN));
}

/* Records a FIN of one side; host_egress and host_ingress may run on two
 * CPUs at once, so the flags are set atomically. A fetching atomic needs a
 * 64-bit operand below -mcpu=v3: port, flags and pad form one aligned
 * 64-bit word (maps/sluice_maps.h), flags in bits 16-31 (little endian). */
static __always_inline __u16 conn_track(struct sluice_snat_value *v, __u8 tcp_flags, __u16 fin)
{
	__u16 before = v->flags;

	if (tcp_flags & TCP_FLAG_FIN)
		before = (__u16)(__sync_fetch_and_or((__u64 *)&v->port, (__u64)fin << 16) >> 16);
	return before;
}

/* Forgets a finished connection; after a FIN exchange its element moves to
 * snat_closed for late packets. */
static __always_inline void conn_forget(const struct sluice_snat_key *k, const struct sluice_snat_value *v,
					int keep_closed)
{
	if (keep_closed)
		bpf_map_update_elem(&snat_closed, k, v, BPF_ANY);
	bpf_map_delete_elem(&snat_rev, k);
}

SEC("tc")
int host_egress(struct __sk_buff *skb)
{
	const struct sluice_settings *cfg = settings_get();
	struct sluice_pod_addr pa = {};
	struct sluice_pod_addr_info *pod;
	struct sluice_snat_key k;
	struct sluice_snat_value *v;
	__u32 probe[4] = {};
	struct flow f;
	int opened = 0;

	/* Rule 11: forwarded traffic arrived somewhere, while a packet the node
	 * sends has no input interface. */
	if (!cfg || skb->ingress_ifindex)
		return SLUICE_NEXT;
	if (parse_flow(skb, &f) != PARSE_OK || f.proto != IPPROTO_TCP)
		return SLUICE_NEXT;
	__builtin_memcpy(pa.addr, f.daddr, 16);
	pa.family = f.family;
	pod = bpf_map_lookup_elem(&pod_addrs, &pa);
	if (!pod)
		return SLUICE_NEXT;
	addr_copy(probe, probe_addr(cfg, f.family), f.family);
	if (addr_eq(f.saddr, probe, f.family))
		return SLUICE_NEXT;

	if (flow_is_syn(&f)) {
		/* Only a local socket opens a probe connection: forwarded
		 * traffic has none. */
		if (!skb->sk)
			return SLUICE_NEXT;
		v = conn_open(&f, probe, pod->netns_cookie, &k, &opened);
		if (!v)
			return TC_ACT_SHOT; /* every candidate port taken: retried later */
		if (opened)
			SLUICE_COUNT(pod->netns_cookie, probe_conns);
	} else {
		/* Socket or not: before Linux 6.13 the IPv6 TCP answers of
		 * the kernel itself (tcp_v6_send_response: the ACKs of a
		 * TIME_WAIT socket, RSTs) leave without skb->sk (IPv4's go
		 * out on a control socket). A prober's socket that is closed
		 * before the pod's FIN is a TIME_WAIT socket by then, so the
		 * final ACK is such a packet: untranslated, the pod's socket
		 * never closed, its port came back to a new probe and that
		 * connection failed (Linux 6.1, vagrant/README.md). The
		 * element says whose packet it is. */
		v = conn_find(&snat_rev, &f, probe, &k);
		if (!v) {
			/* A late packet of a closed probe connection; connections
			 * set up before the pod was enrolled (or forgotten under
			 * pressure) stay as they are. */
			v = conn_find(&snat_closed, &f, probe, &k);
			if (!v)
				return SLUICE_NEXT;
			return nat_rewrite(skb, &f, 1, probe, k.dport) < 0 ? TC_ACT_SHOT : SLUICE_NEXT;
		}
	}

	__u16 flags = conn_track(v, f.tcp_flags, SLUICE_SNAT_FIN_OUT);
	struct sluice_snat_value copy = *v;

	if (nat_rewrite(skb, &f, 1, probe, k.dport) < 0)
		return TC_ACT_SHOT;
	if (snat_closes(flags, f.tcp_flags))
		conn_forget(&k, &copy, !(f.tcp_flags & TCP_FLAG_RST));
	return SLUICE_NEXT;
}

SEC("tc")
int host_ingress(struct __sk_buff *skb)
{
	const struct sluice_settings *cfg = settings_get();
	struct sluice_snat_key k;
	struct sluice_snat_value *v, copy;
	__u32 orig[4];
	struct flow f;

	if (!cfg)
		return SLUICE_NEXT;
	if (parse_flow(skb, &f) != PARSE_OK || f.proto != IPPROTO_TCP)
		return SLUICE_NEXT;
	if (!addr_eq(f.daddr, probe_addr(cfg, f.family), f.family))
		return SLUICE_NEXT;
	__builtin_memset(&k, 0, sizeof(k));
	__builtin_memcpy(k.saddr, f.saddr, 16);
	__builtin_memcpy(k.daddr, f.daddr, 16);
	k.sport = f.sport;
	k.dport = f.dport;
	k.family = f.family;
	v = bpf_map_lookup_elem(&snat_rev, &k);
	if (!v) {
		/* A late packet of a closed probe connection. */
		v = bpf_map_lookup_elem(&snat_closed, &k);
		if (!v)
			return SLUICE_NEXT;
		__builtin_memcpy(orig, v->addr, 16);
		return nat_rewrite(skb, &f, 0, orig, v->port) < 0 ? TC_ACT_SHOT : SLUICE_NEXT;
	}
	__u16 flags = conn_track(v, f.tcp_flags, SLUICE_SNAT_FIN_IN);

	copy = *v;
	__builtin_memcpy(orig, copy.addr, 16);
	if (nat_rewrite(skb, &f, 0, orig, copy.port) < 0)
		return TC_ACT_SHOT;
	if (snat_closes(flags, f.tcp_flags))
		conn_forget(&k, &copy, !(f.tcp_flags & TCP_FLAG_RST));
	return SLUICE_NEXT;
}
