// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sluice's in-pod programs: the BPF counterpart of Istio ambient's in-pod
 * netfilter rules (docs/redirection.md, rules 1-9).
 *
 *   app ──▶ eth0 egress (pod_egress) ─┐ decide; tag the mark; DNS: DNAT
 *                                     │ bpf_redirect(eth0, BPF_F_INGRESS)
 *           eth0 ingress (pod_ingress)◀┘ look up the proxy socket,
 *                                       bpf_sk_assign, return mark
 *   proxy DNS answer ──▶ lo egress (pod_lo_egress): source back to resolver
 *
 * One set of programs serves every pod; the netns cookie selects the pod's
 * settings and counters. A TCP socket's decision is remembered on the
 * socket (sock_verdict), so its later packets cost neither the pod lookup
 * nor a socket-table lookup.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_packet.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/nat.h"
#include "lib/sock.h"
#include "lib/pod.h"
#include "lib/verdict.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct ctx {
	struct __sk_buff *skb;
	const struct sluice_settings *cfg;
	const struct sluice_pod_config *pod;
	__u64 cookie;
	struct bpf_sock *own; /* the packet's own socket (flow_socket), if any */
	struct flow f;
};

/* The pod of the packet's netns; false when it is not enrolled: the
 * packet is then left alone. */
static __always_inline int ctx_pod(struct ctx *c)
{
	c->cookie = pod_cookie(c->skb);
	c->pod = bpf_map_lookup_elem(&pod_config, &c->cookie);
	return c->pod != 0;
}

/* Settings and the pod; false when not enrolled (or not configured yet). */
static __always_inline int ctx_init(struct ctx *c, struct __sk_buff *skb)
{
	c->skb = skb;
	c->cfg = settings_get();
	return c->cfg && ctx_pod(c);
}

/* Packets left alone go to the next program (lib/verdict.h) and are not
 * counted: a per-CPU hash update on every packet was a third of the cost of
 * a passed packet. Decisions (captures, hand-offs, drops) are. */
static __always_inline int pass(struct ctx *c)
{
	return SLUICE_NEXT;
}

static __always_inline int drop(struct ctx *c)
{
	SLUICE_COUNT(c->cookie, dropped_pkts);
	return TC_ACT_SHOT;
}

static __always_inline int is_probe_addr(const struct ctx *c, const __u32 *a)
{
	if (c->f.family == AF_INET)
		return a[0] == c->cfg->probe_v4;
	return addr_eq(a, (const __u32 *)c->cfg->probe_v6, AF_INET6);
}

static __always_inline int is_reroute_iface(const struct ctx *c)
{
	__u32 ifindex = c->skb->ifindex;
	int i;

#pragma unroll
	for (i = 0; i < SLUICE_MAX_REROUTE_IFACES; i++) {
		if (i >= c->pod->reroute_count)
			break;
		if (c->pod->reroute_ifindex[i] == ifindex)
			return 1;
	}
	return 0;
}

/* Sends the packet back in through the ingress hook of the interface it
 * is leaving by; the tag tells pod_ingress what was decided. */
static __always_inline int loop_to_ingress(struct ctx *c, enum sluice_tag tag)
{
	c->skb->mark = SLUICE_TAG_MAGIC | tag;
	return bpf_redirect(c->skb->ifindex, BPF_F_INGRESS);
}

static __always_inline void dns_nat_key(const struct ctx *c, struct sluice_dns_nat_key *k,
					const __u32 *client, __be16 client_port)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->netns_cookie = c->cookie;
	__builtin_memcpy(k->client_addr, client, 16);
	k->client_port = client_port;
	k->family = c->f.family;
	k->proto = c->f.proto;
}

/*
 * Rules 2 and 3. The DNS listener is bound to 127.0.0.1 / ::1 and not
 * transparent, so handing it the packet unchanged is not enough: a TCP
 * handshake from a foreign address would not complete. The query is
 * translated to the pod's own address (the packet's source) and the DNS
 * port, and the resolver's address is recorded so pod_lo_egress can give
 * it back to the answer.
 */
static __always_inline int capture_dns(struct ctx *c, enum sluice_tag tag)
{
	struct sluice_dns_nat_key k;
	struct sluice_dns_nat_value v = {};
	struct sluice_dns_nat_value *old;
	__u32 self[4];

	dns_nat_key(c, &k, c->f.saddr, c->f.sport);
	__builtin_memcpy(v.resolver_addr, c->f.daddr, 16);
	v.resolver_port = c->f.dport;
	/* An LRU update allocates and links a new element even when an equal
	 * one exists (a socket's second query: glibc sends A and AAAA from one
	 * socket); a lookup is much cheaper and refreshes the entry. */
	old = bpf_map_lookup_elem(&dns_nat, &k);
	if (!old || old->resolver_port != v.resolver_port ||
	    !addr_eq((const __u32 *)old->resolver_addr, c->f.daddr, c->f.family)) {
		if (bpf_map_update_elem(&dns_nat, &k, &v, BPF_ANY) < 0)
			return drop(c);
	}
	__builtin_memcpy(self, c->f.saddr, 16);
	if (nat_rewrite(c->skb, &c->f, 0, self, bpf_htons(c->cfg->dns_port)) < 0)
		return drop(c);
	return loop_to_ingress(c, tag);
}

/* A later packet of a TCP DNS connection captured at its SYN. */
static __always_inline int dns_tcp_is_captured(struct ctx *c)
{
	struct sluice_dns_nat_key k;
	struct sluice_dns_nat_value *v;

	dns_nat_key(c, &k, c->f.saddr, c->f.sport);
	v = bpf_map_lookup_elem(&dns_nat, &k);
	return v && v->resolver_port == c->f.dport &&
	       addr_eq((const __u32 *)v->resolver_addr, c->f.daddr, c->f.family);
}

static __always_inline int egress_tcp(struct ctx *c)
{
	struct bpf_sock *sk;

	/* Rule 5: loopback never leaves by a non-lo interface, but a
	 * misrouted one is not ours either. */
	if (addr_is_loopback(c->f.daddr, c->f.family) || is_probe_addr(c, c->f.daddr))
		return pass(c);

	if (c->f.dport == bpf_htons(53) && (c->pod->flags & SLUICE_POD_DNS_CAPTURE)) {
		if (flow_is_syn(&c->f))
			return capture_dns(c, SLUICE_TAG_DNS_TCP); /* rule 2 */
		if (dns_tcp_is_captured(c))
			return capture_dns(c, SLUICE_TAG_OWNED);
	}
	if (flow_is_syn(&c->f)) {
		/* Rule 1. Every later packet of the connection goes to the proxy
		 * socket that accepts it; should there be none (the proxy closed
		 * it), such a packet is delivered locally and answered with a
		 * reset: it never leaves the pod past the proxy. */
		if (c->own)
			verdict_set(c->own, SLUICE_VERDICT_OWNED);
		return loop_to_ingress(c, SLUICE_TAG_OUTBOUND);
	}

	/* Rules 1 and 4 for every later packet: a local socket owns the flow
	 * as its receiver only if the proxy accepted it (outbound) or opened
	 * it with the client's address (the spoofed return path). A connected
	 * socket keeps its addresses, so the answer holds for its life. */
	sk = owner_lookup(c->skb, &c->f);
	if (sk)
		bpf_sk_release(sk);
	if (c->own)
		verdict_set(c->own, sk ? SLUICE_VERDICT_OWNED : SLUICE_VERDICT_PASS);
	if (!sk)
		return pass(c);
	return loop_to_ingress(c, c->f.tcp_flags & TCP_FLAG_SYN ? SLUICE_TAG_OWNED : SLUICE_TAG_OWNED_DATA);
}

/* The proxy's end of an owned flow sent its FIN (the app's socket is in
 * CLOSE_WAIT or beyond): its socket may be gone by now, so pod_ingress
 * looks it up instead of leaving the packet to the stack. Only then: the
 * look-up costs every packet of a live connection otherwise. */
static __always_inline int proxy_may_be_gone(const struct bpf_sock *own)
{
	__u32 st = own->state;

	return st == BPF_TCP_CLOSE_WAIT || st == BPF_TCP_LAST_ACK || st == BPF_TCP_CLOSING;
}

SEC("tc")
int pod_egress(struct __sk_buff *skb)
{
	struct ctx c = { .skb = skb };

	c.cfg = settings_get();
	if (!c.cfg)
		return SLUICE_NEXT;
	/* Rule 5: the proxy's own traffic, half the packets of every redirected
	 * connection, leaves before any per-pod lookup. A marked packet from
	 * another cgroup than the proxy's (when those are known) is an app
	 * that set the mark itself: it is judged like any other. */
	if ((skb->mark & c.cfg->mark_mask) == c.cfg->proxy_mark && proxy_marked_is_proxy(skb))
		return SLUICE_NEXT;
	switch (parse_flow(skb, &c.f)) {
	case PARSE_OK:
		break;
	case PARSE_DROP:
		/* Fail closed: it could be TCP we cannot see (sockets never send
		 * such frames; raw and packet sockets can). */
		return ctx_pod(&c) ? drop(&c) : SLUICE_NEXT;
	case PARSE_UDP_FRAGMENT:
		/* A DNS query too large for one packet: it cannot be translated
		 * (the later fragments carry no ports), and must not reach the
		 * resolver around the proxy. The datagram is lost without its
		 * first fragment; other UDP is left alone (rule 5). */
		if (c.f.dport == bpf_htons(53) && ctx_pod(&c) && (c.pod->flags & SLUICE_POD_DNS_CAPTURE))
			return drop(&c);
		return SLUICE_NEXT;
	default:
		return SLUICE_NEXT;
	}
	/* A later packet of a TCP socket decided before: no lookup at all.
	 * (TCP DNS flows are translated packet by packet: not remembered.) */
	if (c.f.proto == IPPROTO_TCP) {
		c.own = flow_socket(skb, &c.f);
		if (c.own && !(c.f.tcp_flags & TCP_FLAG_SYN) && c.f.dport != bpf_htons(53)) {
			__u32 v = verdict_get(c.own);

			if (v == SLUICE_VERDICT_PASS)
				return SLUICE_NEXT;
			if (v == SLUICE_VERDICT_OWNED)
				return loop_to_ingress(&c, proxy_may_be_gone(c.own) ? SLUICE_TAG_OWNED
										: SLUICE_TAG_OWNED_DATA);
		}
	}
	if (!ctx_pod(&c))
		return SLUICE_NEXT;

	if (c.f.proto == IPPROTO_TCP)
		return egress_tcp(&c);
	if (c.f.dport == bpf_htons(53) && (c.pod->flags & SLUICE_POD_DNS_CAPTURE))
		return capture_dns(&c, SLUICE_TAG_DNS_UDP); /* rule 3 */
	return pass(&c);
}

/* Hands a new connection to the TCP listener on port, with TPROXY
 * semantics: the headers stay, so the accepted socket's local address is
 * the original destination. No listener: fail closed. The listener comes
 * from pod_listeners when the pod's was seen before (lib/sock.h). */
static __always_inline int to_listener(struct ctx *c, const __u32 *daddr, __u16 port)
{
	struct bpf_sock *sk = pod_listener(c->skb, &c->f, c->cookie, daddr, port);

	if (!sk || assign_release(c->skb, sk) < 0) {
		SLUICE_COUNT(c->cookie, dropped_pkts);
		return -1;
	}
	/* Policy routing delivers a packet with the return mark locally, so a
	 * foreign destination is accepted. */
	c->skb->mark = c->cfg->return_mark;
	return 0;
}

/*
 * Turns the looped packet into a reset to its sender (the app's socket)
 * and delivers that: the packet mirrored -- addresses, ports, sequence and
 * acknowledgment numbers swapped, which changes no checksum -- with flags
 * RST|ACK, which changes one word of the TCP checksum. Its sequence number
 * is the app's acknowledgment, the app's rcv_nxt exactly, as RFC 5961 wants
 * of an acceptable reset. The payload stays (a reset may carry data; the
 * receiver ignores it). Counted as dropped: the packet never reached
 * anyone.
 */
static __always_inline int reset_sender(struct ctx *c)
{
	struct tcp_start {
		__be16 sport, dport;
		__be32 seq, ack_seq;
		__be16 doff_flags;
	} in, out;
	__u32 addr_off, addr_len;

	if (load_hdr(c->skb, c->f.l4_off, &in, sizeof(in)) < 0)
		return drop(c);
	out.sport = in.dport;
	out.dport = in.sport;
	out.seq = in.ack_seq;
	out.ack_seq = in.seq;
	out.doff_flags = (in.doff_flags & bpf_htons(0xff00)) | bpf_htons(TCP_FLAG_RST | TCP_FLAG_ACK);
	if (c->f.family == AF_INET) {
		addr_off = c->f.l3_off + offsetof(struct iphdr, saddr);
		addr_len = 4;
	} else {
		addr_off = c->f.l3_off + offsetof(struct ipv6hdr, saddr);
		addr_len = 16;
	}
	if (bpf_l4_csum_replace(c->skb, c->f.l4_off + 16, in.doff_flags, out.doff_flags, 2) < 0 ||
	    bpf_skb_store_bytes(c->skb, c->f.l4_off, &out, sizeof(out), 0) < 0 ||
	    bpf_skb_store_bytes(c->skb, addr_off, c->f.daddr, addr_len, 0) < 0 ||
	    bpf_skb_store_bytes(c->skb, addr_off + addr_len, c->f.saddr, addr_len, 0) < 0)
		return drop(c);
	SLUICE_COUNT(c->cookie, dropped_pkts);
	return SLUICE_DONE;
}

/* A packet pod_egress looped back: hand it to the proxy socket chosen. */
static __always_inline int ingress_looped(struct ctx *c, __u32 tag)
{
	struct bpf_sock *sk;
	__u32 lo[4];

	/* After the redirect the packet still carries the gateway's MAC and
	 * would be dropped as PACKET_OTHERHOST before IP input. */
	bpf_skb_change_type(c->skb, PACKET_HOST);
	c->skb->mark = c->cfg->return_mark;
	if (parse_flow(c->skb, &c->f) != PARSE_OK)
		return drop(c);

	if (tag == SLUICE_TAG_DNS_UDP) {
		if (c->f.proto != IPPROTO_UDP)
			return drop(c);
		addr_set_loopback(lo, c->f.family);
		sk = udp_lookup(c->skb, &c->f, lo, c->cfg->dns_port);
		if (!sk || assign_release(c->skb, sk) < 0)
			return drop(c);
		SLUICE_COUNT(c->cookie, dns_udp_queries);
		return SLUICE_DONE;
	}
	if (c->f.proto != IPPROTO_TCP)
		return drop(c);

	/* A later packet of a flow pod_egress found a proxy socket for (or of
	 * a captured TCP DNS flow, now addressed to the pod itself, or of a
	 * flow whose proxy end closed): delivered locally to the socket that
	 * owns it. None any more: the proxy's socket is gone, and the stack
	 * could not even answer with a reset (its source, the original
	 * destination, is not a local address): reset the app instead. */
	if (tag == SLUICE_TAG_OWNED && !(c->f.tcp_flags & TCP_FLAG_SYN)) {
		sk = owner_lookup(c->skb, &c->f);
		if (!sk)
			return reset_sender(c);
		bpf_sk_release(sk);
		SLUICE_COUNT(c->cookie, owned_pkts);
		return SLUICE_DONE;
	}

	/* Retransmitted SYNs go to the socket that owns the flow (request,
	 * established or time-wait socket). */
	sk = owner_lookup(c->skb, &c->f);
	if (sk) {
		if (assign_release(c->skb, sk) < 0)
			return drop(c);
		SLUICE_COUNT(c->cookie, owned_pkts);
		return SLUICE_DONE;
	}
	if (!flow_is_syn(&c->f))
		return drop(c); /* its proxy socket is gone: never leak it */

	if (tag == SLUICE_TAG_DNS_TCP) {
		addr_set_loopback(lo, c->f.family);
		if (to_listener(c, lo, c->cfg->dns_port) < 0)
			return TC_ACT_SHOT;
		SLUICE_COUNT(c->cookie, dns_tcp_conns);
		return SLUICE_DONE;
	}
	if (tag == SLUICE_TAG_OUTBOUND) {
		if (to_listener(c, c->f.daddr, c->cfg->outbound_port) < 0)
			return TC_ACT_SHOT;
		SLUICE_COUNT(c->cookie, outbound_conns);
		return SLUICE_DONE;
	}
	return drop(c);
}

/* A later TCP packet (no SYN) of a flow pod_egress found a proxy socket
 * for: delivered locally (see ingress_looped), counted, nothing parsed. */
static __always_inline int ingress_owned_data(struct __sk_buff *skb)
{
	const struct sluice_settings *cfg = settings_get();
	__u64 cookie;

	if (!cfg)
		return TC_ACT_SHOT;
	bpf_skb_change_type(skb, PACKET_HOST);
	skb->mark = cfg->return_mark;
	cookie = pod_cookie(skb);
	SLUICE_COUNT(cookie, owned_pkts);
	return SLUICE_DONE;
}

/* Rule 6's reach, with rules 7 and 8 and the options: what a SYN arriving
 * at the pod (not on a reroute interface) is handed to 15006 for. */
static __always_inline int inbound_captured(const struct ctx *c)
{
	return (c->pod->flags & SLUICE_POD_INBOUND_CAPTURE) &&
	       c->f.dport != bpf_htons(c->cfg->hbone_port) && /* rule 7 */
	       !is_probe_addr(c, c->f.saddr) &&                 /* rule 8 */
	       !addr_is_loopback(c->f.daddr, c->f.family);
}

/*
 * Rule 6 for a later segment (no SYN) arriving at the pod: it goes to the
 * socket that owns its connection -- established, SYN_SENT, time-wait or
 * request socket -- untouched, so replies to connections opened outwards
 * and everything of a live connection are never hijacked. A segment that
 * no socket owns belongs to no connection here: the ACK that completes a
 * handshake the proxy's listener answered with a SYN cookie (no request
 * socket is kept), or a stray. It goes where its SYN would have gone, to
 * the 15006 listener, which judges it: accepts a valid cookie, answers
 * other ACKs with a reset, ignores resets -- what Istio's REDIRECT
 * (conntrack) and TPROXY do too. Left to the stack, it would reach
 * whatever listens on the destination port: the cookie secret is per
 * host, so an app whose listener overflowed recently accepts a cookie the
 * proxy issued, and the connection bypasses the proxy; without such an
 * app, every cookie handshake would be reset. No proxy listener: dropped
 * and counted (fail closed), never the app's.
 *
 * While Istio's in-pod rules are there too (a node switching between
 * Istio's node agent and sluice), its REDIRECT translated the SYN to 15006
 * after this hook: the connection's socket is at the inbound port, and its
 * segments, found there, are handed to it (the translation then brings
 * their header to that port). A crafted segment can reach only a
 * connection to 15006 of its own source, never the app.
 *
 * The price is a socket lookup for each inbound TCP segment of a pod
 * whose inbound traffic is captured (iptables' TPROXY path does the same
 * per packet), two for a segment no socket owns. Reroute interfaces,
 * where only SYNs are captured (to 15001), keep the old rule.
 */
static __always_inline int ingress_later(struct ctx *c)
{
	struct bpf_sock *sk;

	if (c->pod->reroute_count && is_reroute_iface(c))
		return pass(c);
	if (!inbound_captured(c))
		return pass(c);
	sk = owner_lookup(c->skb, &c->f);
	if (sk) {
		bpf_sk_release(sk);
		return pass(c);
	}
	sk = owner_at_port(c->skb, &c->f, c->cfg->inbound_port);
	if (sk) {
		if (assign_release(c->skb, sk))
			return drop(c);
		SLUICE_COUNT(c->cookie, owned_pkts);
		return SLUICE_NEXT;
	}
	if (to_listener(c, c->f.daddr, c->cfg->inbound_port) < 0)
		return TC_ACT_SHOT;
	SLUICE_COUNT(c->cookie, owned_pkts);
	/* Handed on like the SYN: the programs after sluice see inbound
	 * connection set-up as they would after Istio's rules. */
	return SLUICE_NEXT;
}

SEC("tc")
int pod_ingress(struct __sk_buff *skb)
{
	struct ctx c = {};
	__u32 mark = skb->mark;

	/* Only pod_egress sets the tag: the kernel clears skb->mark when a
	 * packet crosses into this netns, so a real inbound packet has none. */
	if (mark == (SLUICE_TAG_MAGIC | SLUICE_TAG_OWNED_DATA))
		return ingress_owned_data(skb);
	if ((mark & SLUICE_TAG_MASK) == SLUICE_TAG_MAGIC)
		return ctx_init(&c, skb) ? ingress_looped(&c, mark & ~SLUICE_TAG_MASK) : SLUICE_NEXT;

	/* Rules 9 and 6: only TCP is captured. What cannot be judged is
	 * dropped: the stack would reassemble it (or find the TCP header
	 * behind a long chain) after this hook. */
	switch (parse_flow(skb, &c.f)) {
	case PARSE_OK:
		if (c.f.proto != IPPROTO_TCP)
			return SLUICE_NEXT;
		break;
	case PARSE_DROP:
		return ctx_init(&c, skb) ? drop(&c) : SLUICE_NEXT;
	default:
		return SLUICE_NEXT; /* rule 9: UDP fragments too */
	}
	if (!ctx_init(&c, skb))
		return SLUICE_NEXT;
	if (!flow_is_syn(&c.f))
		return ingress_later(&c);

	/* Virtual interfaces: TCP arriving there is outbound traffic. A real
	 * inbound packet handed to the proxy goes on to the next program (lib/
	 * verdict.h): others see inbound connection set-up as they would before
	 * Istio's TPROXY rules. */
	if (c.pod->reroute_count && is_reroute_iface(&c)) {
		if (to_listener(&c, c.f.daddr, c.cfg->outbound_port) < 0)
			return TC_ACT_SHOT;
		SLUICE_COUNT(c.cookie, outbound_conns);
		return SLUICE_NEXT;
	}
	if (!inbound_captured(&c))
		return pass(&c);
	if (to_listener(&c, c.f.daddr, c.cfg->inbound_port) < 0) /* rule 6 */
		return TC_ACT_SHOT;
	SLUICE_COUNT(c.cookie, inbound_conns);
	return SLUICE_NEXT;
}

/* Rules 2 and 3, the answer: on lo, where the DNS listener's replies to the
 * pod's own address pass, give them back the resolver's address and port. */
SEC("tc")
int pod_lo_egress(struct __sk_buff *skb)
{
	struct ctx c = { .skb = skb };
	struct sluice_dns_nat_key k;
	struct sluice_dns_nat_value *v;
	__u32 resolver[4];

	c.cfg = settings_get();
	if (!c.cfg)
		return SLUICE_NEXT;
	if (parse_flow(skb, &c.f) != PARSE_OK || c.f.sport != bpf_htons(c.cfg->dns_port))
		return SLUICE_NEXT;
	c.cookie = pod_cookie(skb);
	dns_nat_key(&c, &k, c.f.daddr, c.f.dport);
	v = bpf_map_lookup_elem(&dns_nat, &k);
	if (!v)
		return SLUICE_NEXT;
	/* Only the DNS listener's answers: UDP from the loopback address it is
	 * bound to, TCP from the pod address the query was translated to. */
	if (!addr_is_loopback(c.f.saddr, c.f.family) &&
	    !addr_eq(c.f.saddr, c.f.daddr, c.f.family))
		return SLUICE_NEXT;
	__builtin_memcpy(resolver, v->resolver_addr, 16);
	if (nat_rewrite(skb, &c.f, 1, resolver, v->resolver_port) < 0)
		return TC_ACT_SHOT;
	SLUICE_COUNT(c.cookie, dns_answers);
	return SLUICE_NEXT;
}
