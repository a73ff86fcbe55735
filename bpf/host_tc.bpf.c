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
 * Only packets of a local socket are translated (skb->sk set); forwarded
 * traffic (another node's, kube-proxy's NAT) has none and stays as it is, so
 * the pod's proxy still captures it.
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

static __always_inline void snat_key(struct sluice_snat_key *k, const struct flow *f)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->saddr, f->saddr, 16);
	__builtin_memcpy(k->daddr, f->daddr, 16);
	k->sport = f->sport;
	k->dport = f->dport;
	k->family = f->family;
}

static __always_inline const __u32 *probe_addr(const struct sluice_settings *cfg, __u8 family)
{
	return family == AF_INET ? &cfg->probe_v4 : (const __u32 *)cfg->probe_v6;
}

/* Forgets a finished connection: both directions' entries leave the live
 * maps; after a FIN exchange they move to snat_closed for late packets. */
static __always_inline void snat_forget(const struct sluice_snat_key *fwd_key,
					const struct sluice_snat_key *rev_key, int keep_closed)
{
	if (keep_closed) {
		struct sluice_snat_value *v = bpf_map_lookup_elem(&snat_fwd, fwd_key);

		if (v)
			bpf_map_update_elem(&snat_closed, fwd_key, v, BPF_ANY);
		v = bpf_map_lookup_elem(&snat_rev, rev_key);
		if (v)
			bpf_map_update_elem(&snat_closed, rev_key, v, BPF_ANY);
	}
	bpf_map_delete_elem(&snat_fwd, fwd_key);
	bpf_map_delete_elem(&snat_rev, rev_key);
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

/* The reply key of a translated connection: pod -> probe addr:port. */
static __always_inline void rev_key_of(struct sluice_snat_key *rk, const struct flow *f,
				       const __u32 *probe, __be16 port)
{
	__builtin_memset(rk, 0, sizeof(*rk));
	__builtin_memcpy(rk->saddr, f->daddr, 16);
	addr_copy(rk->daddr, probe, f->family);
	rk->sport = f->dport;
	rk->dport = port;
	rk->family = f->family;
}

/*
 * Picks the translated source port for a new probe connection: the
 * prober's own port when free, otherwise a few others derived from it. Two
 * probers with different node addresses and the same port would otherwise
 * collide on (probe addr, port). The reverse entry is claimed atomically
 * (BPF_NOEXIST), so two CPUs never hand out the same one.
 */
static __always_inline int snat_allocate(const struct flow *f, const __u32 *probe,
					 __u64 cookie, struct sluice_snat_key *rk, __be16 *port)
{
	struct sluice_snat_value orig = {};
	__u16 base = bpf_ntohs(f->sport);
	int i;

	__builtin_memcpy(orig.addr, f->saddr, 16);
	orig.port = f->sport;
	orig.netns_cookie = cookie;
#pragma unroll
	for (i = 0; i < SLUICE_SNAT_PORT_TRIES; i++) {
		/* Stay in the ephemeral range 1024-65535 after the first try. */
		__u16 cand = i == 0 ? base : (__u16)(1024 + (base + i * 7919) % 64512);

		rev_key_of(rk, f, probe, bpf_htons(cand));
		if (bpf_map_update_elem(&snat_rev, rk, &orig, BPF_NOEXIST) == 0) {
			*port = bpf_htons(cand);
			return 0;
		}
	}
	return -1;
}

SEC("tc")
int host_egress(struct __sk_buff *skb)
{
	const struct sluice_settings *cfg = settings_get();
	struct sluice_pod_addr pa = {};
	struct sluice_pod_addr_info *pod;
	struct sluice_snat_key fk, rk;
	struct sluice_snat_value *fwd, nv = {};
	__u32 probe[4] = {};
	struct flow f;

	/* Rule 11: forwarded traffic has no socket; and it arrived somewhere,
	 * while a packet the node sends has no input interface (a second guard,
	 * should a kernel ever leave a socket on a forwarded packet). */
	if (!cfg || !skb->sk || skb->ingress_ifindex)
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

	snat_key(&fk, &f);
	fwd = bpf_map_lookup_elem(&snat_fwd, &fk);
	if (!fwd && !flow_is_syn(&f)) {
		/* A late packet of a closed probe connection; connections set up
		 * before the pod was enrolled stay as they are. */
		fwd = bpf_map_lookup_elem(&snat_closed, &fk);
		if (!fwd)
			return SLUICE_NEXT;
		return nat_rewrite(skb, &f, 1, probe, fwd->port) < 0 ? TC_ACT_SHOT : SLUICE_NEXT;
	}
	if (!fwd) {
		bpf_map_delete_elem(&snat_closed, &fk); /* the port is reused */
		if (snat_allocate(&f, probe, pod->netns_cookie, &rk, &nv.port) < 0)
			return TC_ACT_SHOT; /* every candidate port taken: retry later */
		__builtin_memcpy(nv.addr, probe, 16);
		nv.netns_cookie = pod->netns_cookie;
		if (bpf_map_update_elem(&snat_fwd, &fk, &nv, BPF_ANY) < 0) {
			bpf_map_delete_elem(&snat_rev, &rk);
			return TC_ACT_SHOT;
		}
		fwd = bpf_map_lookup_elem(&snat_fwd, &fk);
		if (!fwd)
			return TC_ACT_SHOT;
		SLUICE_COUNT(nv.netns_cookie, probe_conns);
	} else {
		rev_key_of(&rk, &f, probe, fwd->port);
	}

	__be16 port = fwd->port;
	__u16 flags = fwd->flags;

	if (f.tcp_flags & TCP_FLAG_FIN)
		fwd->flags = flags | SLUICE_SNAT_FIN_OUT;
	if (nat_rewrite(skb, &f, 1, probe, port) < 0)
		return TC_ACT_SHOT;
	if (snat_closes(flags, f.tcp_flags))
		snat_forget(&fk, &rk, !(f.tcp_flags & TCP_FLAG_RST));
	return SLUICE_NEXT;
}

SEC("tc")
int host_ingress(struct __sk_buff *skb)
{
	const struct sluice_settings *cfg = settings_get();
	struct sluice_snat_key rk, fk;
	struct sluice_snat_value *rev, *fwd;
	__u32 orig[4];
	__be16 orig_port;
	struct flow f;

	if (!cfg)
		return SLUICE_NEXT;
	if (parse_flow(skb, &f) != PARSE_OK || f.proto != IPPROTO_TCP)
		return SLUICE_NEXT;
	if (!addr_eq(f.daddr, probe_addr(cfg, f.family), f.family))
		return SLUICE_NEXT;
	snat_key(&rk, &f);
	rev = bpf_map_lookup_elem(&snat_rev, &rk);
	if (!rev) {
		/* A late packet of a closed probe connection. */
		rev = bpf_map_lookup_elem(&snat_closed, &rk);
		if (!rev)
			return SLUICE_NEXT;
		__builtin_memcpy(orig, rev->addr, 16);
		return nat_rewrite(skb, &f, 0, orig, rev->port) < 0 ? TC_ACT_SHOT : SLUICE_NEXT;
	}
	__builtin_memcpy(orig, rev->addr, 16);
	orig_port = rev->port;

	/* The forward key: prober -> pod, as the prober sent it. */
	__builtin_memset(&fk, 0, sizeof(fk));
	__builtin_memcpy(fk.saddr, orig, 16);
	__builtin_memcpy(fk.daddr, f.saddr, 16);
	fk.sport = orig_port;
	fk.dport = f.sport;
	fk.family = f.family;
	fwd = bpf_map_lookup_elem(&snat_fwd, &fk);

	if (nat_rewrite(skb, &f, 0, orig, orig_port) < 0)
		return TC_ACT_SHOT;
	if (fwd) {
		__u16 flags = fwd->flags;

		if (f.tcp_flags & TCP_FLAG_FIN)
			fwd->flags = flags | SLUICE_SNAT_FIN_IN;
		if (snat_closes(flags, f.tcp_flags))
			snat_forget(&fk, &rk, !(f.tcp_flags & TCP_FLAG_RST));
	} else if (f.tcp_flags & TCP_FLAG_RST) {
		bpf_map_delete_elem(&snat_rev, &rk);
	}
	return SLUICE_NEXT;
}
