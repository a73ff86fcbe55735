/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket look-ups and hand-off (bpf_sk_assign): TPROXY semantics at TC. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "maps.h"
#include "parse.h"

#ifndef BPF_F_CURRENT_NETNS
#define BPF_F_CURRENT_NETNS (-1L)
#endif

/* Builds a lookup tuple from the packet, with the destination replaced by
 * daddr:dport (both network byte order). Returns the tuple's size. */
static __always_inline __u32 tuple_build(struct bpf_sock_tuple *t, const struct flow *f,
					 const __u32 *daddr, __be16 dport)
{
	__builtin_memset(t, 0, sizeof(*t));
	if (f->family == AF_INET) {
		t->ipv4.saddr = f->saddr[0];
		t->ipv4.daddr = daddr[0];
		t->ipv4.sport = f->sport;
		t->ipv4.dport = dport;
		return sizeof(t->ipv4);
	}
	__builtin_memcpy(t->ipv6.saddr, f->saddr, 16);
	__builtin_memcpy(t->ipv6.daddr, daddr, 16);
	t->ipv6.sport = f->sport;
	t->ipv6.dport = dport;
	return sizeof(t->ipv6);
}

/*
 * The socket that owns the packet's flow as its receiver: an established,
 * request (SYN_RECV), SYN_SENT or TIME_WAIT socket whose local end is the
 * packet's destination. The kernel's socket table is the connection state,
 * so no flow map is kept. Listeners are not owners (the listener look-up
 * falls back to any socket listening on the destination port).
 */
static __always_inline struct bpf_sock *owner_lookup(struct __sk_buff *skb, const struct flow *f)
{
	struct bpf_sock_tuple t;
	__u32 len = tuple_build(&t, f, f->daddr, f->dport);
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);

	if (sk && sk->state == BPF_TCP_LISTEN) {
		bpf_sk_release(sk);
		return 0;
	}
	return sk;
}

/*
 * The socket that owns f's connection had its destination port been port
 * (host byte order): where a NAT in the pod's netns -- Istio's REDIRECT to
 * 15006, while a node switches between Istio's node agent and sluice --
 * keeps it. Not a listener.
 */
static __always_inline struct bpf_sock *owner_at_port(struct __sk_buff *skb, const struct flow *f, __u16 port)
{
	struct bpf_sock_tuple t;
	__u32 len = tuple_build(&t, f, f->daddr, bpf_htons(port));
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);

	if (sk && sk->state == BPF_TCP_LISTEN) {
		bpf_sk_release(sk);
		return 0;
	}
	return sk;
}

/* The TCP listener on daddr:port (host byte order port), if any. */
static __always_inline struct bpf_sock *listener_lookup(struct __sk_buff *skb, const struct flow *f,
							const __u32 *daddr, __u16 port)
{
	struct bpf_sock_tuple t;
	__u32 len = tuple_build(&t, f, daddr, bpf_htons(port));
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);

	if (sk && sk->state != BPF_TCP_LISTEN) {
		bpf_sk_release(sk);
		return 0;
	}
	return sk;
}

static __always_inline int bound_to_wildcard(const struct bpf_sock *sk)
{
	if (sk->family == AF_INET)
		return sk->src_ip4 == 0;
	return (sk->src_ip6[0] | sk->src_ip6[1] | sk->src_ip6[2] | sk->src_ip6[3]) == 0;
}

/*
 * listener_lookup through the pod_listeners cache (maps/sluice_maps.h):
 * the pod's listener on port for packets of f's family. A miss searches
 * the socket table and keeps a wildcard-bound answer; failing to keep it
 * (no memory, a socket another user already holds) only costs the next
 * connection the search again.
 */
static __always_inline struct bpf_sock *pod_listener(struct __sk_buff *skb, const struct flow *f,
						     __u64 cookie, const __u32 *daddr, __u16 port)
{
	struct sluice_listener_key k = { .netns_cookie = cookie, .port = port, .family = f->family };
	struct bpf_sock *sk = bpf_map_lookup_elem(&pod_listeners, &k);

	if (sk) {
		if (sk->state == BPF_TCP_LISTEN)
			return sk;
		bpf_sk_release(sk);
	}
	sk = listener_lookup(skb, f, daddr, port);
	if (sk && bound_to_wildcard(sk))
		bpf_map_update_elem(&pod_listeners, &k, sk, BPF_ANY);
	return sk;
}

/* The UDP socket bound to daddr:port, if any. */
static __always_inline struct bpf_sock *udp_lookup(struct __sk_buff *skb, const struct flow *f,
						   const __u32 *daddr, __u16 port)
{
	struct bpf_sock_tuple t;
	__u32 len = tuple_build(&t, f, daddr, bpf_htons(port));

	return bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
}

/* Hands skb to sk and releases the reference. 0 on success. */
static __always_inline long assign_release(struct __sk_buff *skb, struct bpf_sock *sk)
{
	long ret = bpf_sk_assign(skb, sk, 0);

	bpf_sk_release(sk);
	return ret;
}

/*
 * The packet's own socket when it is the full TCP socket of exactly this
 * flow: what pod_egress's decision can be remembered on. Request,
 * time-wait and the stack's control sockets (resets, time-wait ACKs) do not
 * qualify. An IPv6 socket sending IPv4 does: a dual-stack socket (bound to
 * [::] without IPV6_V6ONLY, Java's default) connected to a v4-mapped
 * address. Its IPv4 ends are in src_ip4 / dst_ip4 like an IPv4 socket's
 * (the kernel keeps both in sock_common), its IPv6 destination is
 * ::ffff:a.b.c.d.
 */
static __always_inline struct bpf_sock *flow_socket(struct __sk_buff *skb, const struct flow *f)
{
	struct bpf_sock *sk = skb->sk;

	if (!sk)
		return 0;
	sk = bpf_sk_fullsock(sk);
	if (!sk || sk->protocol != IPPROTO_TCP || sk->src_port != bpf_ntohs(f->sport))
		return 0;
	if (f->family == AF_INET) {
		if (sk->family == AF_INET6 &&
		    (sk->dst_ip6[0] || sk->dst_ip6[1] || sk->dst_ip6[2] != bpf_htonl(0xffff)))
			return 0;
		return sk->src_ip4 == f->saddr[0] && sk->dst_ip4 == f->daddr[0] ? sk : 0;
	}
	if (sk->family != AF_INET6)
		return 0;
	if (sk->src_ip6[0] != f->saddr[0] || sk->src_ip6[1] != f->saddr[1] ||
	    sk->src_ip6[2] != f->saddr[2] || sk->src_ip6[3] != f->saddr[3] ||
	    sk->dst_ip6[0] != f->daddr[0] || sk->dst_ip6[1] != f->daddr[1] ||
	    sk->dst_ip6[2] != f->daddr[2] || sk->dst_ip6[3] != f->daddr[3])
		return 0;
	return sk;
}

/* The decision remembered on sk (enum sluice_verdict). */
static __always_inline __u32 verdict_get(struct bpf_sock *sk)
{
	struct sluice_sock_verdict *v = bpf_sk_storage_get(&sock_verdict, sk, 0, 0);

	return v ? v->verdict : SLUICE_VERDICT_NONE;
}

/* Remembers a decision on sk; best effort (no memory: decided again). */
static __always_inline void verdict_set(struct bpf_sock *sk, __u32 verdict)
{
	struct sluice_sock_verdict *v =
		bpf_sk_storage_get(&sock_verdict, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);

	if (v)
		v->verdict = verdict;
}
