// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The socket mode: the redirection contract (docs/redirection.md,
 * rules 1-9) at the socket layer instead of the TC hooks.
 *
 *   app connect(D) ──▶ pod_connect4/6 (cgroup, node-wide): D kept on the
 *        socket, destination rewritten to the pod's own address :15001
 *        ──lo──▶ proxy's outbound listener; its SO_ORIGINAL_DST ──▶
 *        pod_getsockopt (D, found by the app's address and port, recorded
 *        by pod_sockops when the connection left); the app's getpeername
 *        ──▶ pod_getpeername4/6 (D)
 *   app DNS to R:53 ──▶ connect/sendmsg: to the DNS listener on loopback;
 *        answers and getpeername ──▶ R:53 (pod_recvmsg4/6, getpeername)
 *   SYN from outside ──▶ pod_sk_lookup (the pod's netns): the proxy's
 *        inbound listener (sock_listeners, filled by pod_sockops on listen)
 *   the proxy's spoofed connection to an app (rule 4): pod_skb_ingress
 *        gives its SYN the return mark, which the app's accepted socket
 *        keeps (tcp_fwmark_accept): replies are routed back locally
 *   what leaves the pod uncaptured all the same (raw sockets, source
 *        routes, loopback ends, a TCP SYN or UDP DNS past the hooks):
 *        dropped at the pod's interfaces (pod_skb_egress)
 *
 * Every program but pod_sk_lookup runs for every socket of the cgroup it
 * is attached to (the node's); the netns cookie selects the pod's settings
 * (pod_sock), so a socket outside an enrolled pod costs one hash lookup.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "lib/sock_maps.h"
#include "lib/sock_addr.h"
#include "lib/pod.h"
#include "lib/parse.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#ifndef SOCK_STREAM
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define SOCK_RAW 3
#endif
#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif
#define SLUICE_SOL_IP 0
#define SLUICE_SOL_IPV6 41
#define SLUICE_SO_ORIGINAL_DST 80 /* = IP6T_SO_ORIGINAL_DST */
#define SLUICE_LOOPBACK_IFINDEX 1  /* lo is ifindex 1 in every netns */

/* The settings and the pod of a sock_addr program's socket. */
struct sctx {
	const struct sluice_settings *cfg;
	const struct sluice_pod_sock *pod;
	__u64 cookie;
};

static __always_inline int sctx_init(struct sctx *c, void *ctx)
{
	c->cfg = settings_get();
	if (!c->cfg)
		return 0;
	c->cookie = bpf_get_netns_cookie(ctx);
	c->pod = bpf_map_lookup_elem(&pod_sock, &c->cookie);
	return c->pod != 0;
}

/* With the proxy's identity known, is this cgroup (v2 id) one of its? */
static __always_inline int cgroup_is_proxy(__u64 cg)
{
	__u32 zero = 0;
	const struct sluice_proxy_identity *id = bpf_map_lookup_elem(&proxy_identity, &zero);

	if (!id || !id->cgroup_check)
		return 1;
	return cg && bpf_map_lookup_elem(&proxy_cgroups, &cg) != 0;
}

/* Rule 5: a socket of the proxy — its mark, and once the proxy's cgroups
 * are known, set by a process in one of them (the caller of connect/sendmsg
 * is the socket's user). */
static __always_inline int sock_is_proxy(const struct sluice_settings *cfg, const struct bpf_sock *sk)
{
	if ((sk->mark & cfg->mark_mask) != cfg->proxy_mark)
		return 0;
	return cgroup_is_proxy(bpf_get_current_cgroup_id());
}

/* Binds a socket that is not bound to the pod's address of the family
 * (v4-mapped on an IPv6 socket for IPv4), without a port: the kernel picks
 * the port at connect(). Whether the socket now has that source. */
static __always_inline int bind_pod_source(struct bpf_sock_addr *ctx, const struct sctx *c, __u8 family, const int v6)
{
	__u32 self[4];

	if (!pod_addr(c->pod, family, self))
		return 0;
	if (!v6) {
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = self[0] };

		return bpf_bind(ctx, (struct sockaddr *)&sin, sizeof(sin)) == 0;
	} else {
		struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6 };

		if (family == AF_INET) {
			sin6.sin6_addr.in6_u.u6_addr32[2] = bpf_htonl(0xffff);
			sin6.sin6_addr.in6_u.u6_addr32[3] = self[0];
		} else {
			__builtin_memcpy(&sin6.sin6_addr, self, 16);
		}
		return bpf_bind(ctx, (struct sockaddr *)&sin6, sizeof(sin6)) == 0;
	}
}

/* A hash of a captured connection's original destination (address and
 * port), which picks its place on loopback (maps/sluice_maps.h): each
 * destination keeps a port space of its own, as it does under REDIRECT. */
static __always_inline __u32 dest_hash(const struct sa_addr *d)
{
	__u32 h = bpf_ntohl(d->a[0] ^ d->a[1] ^ d->a[2] ^ d->a[3]) * 0x9e3779b1u ^
		  (__u32)bpf_ntohs(d->port) * 0x85ebca6bu;

	return h ^ (h >> 16);
}

/* IPv4: the address in 127.1.0.0/16. */
static __always_inline __u32 loopback_for(const struct sa_addr *d)
{
	return bpf_htonl(SLUICE_PROXY_LO_NET | (dest_hash(d) & 0xffffu));
}

/* IPv6: the port of [::1] (host order). */
static __always_inline __u16 loopback_port_for(const struct sa_addr *d)
{
	return SLUICE_PROXY_LO6_PORT_BASE + (dest_hash(d) & ((1u << SLUICE_PROXY_LO6_PORT_BITS) - 1));
}

static __always_inline int is_proxy_lo6_port(__u32 port)
{
	return port >= SLUICE_PROXY_LO6_PORT_BASE &&
	       port < SLUICE_PROXY_LO6_PORT_BASE + (1u << SLUICE_PROXY_LO6_PORT_BITS);
}

/* The orig_dst key's proxy_lo for a connection's proxy end @x (the app
 * socket's peer, the accepted socket's local address and port): the low
 * half of an address of 127.1.0.0/16, or a port of [::1] in the block;
 * else 0. */
static __always_inline __u16 proxy_lo_of(const struct sa_addr *x)
{
	__u32 a = bpf_ntohl(x->a[0]);
	__u16 port = bpf_ntohs(x->port);

	if (x->family == AF_INET6)
		return sa_is_loopback(x) && is_proxy_lo6_port(port) ? port : 0;
	if ((a & 0xffff0000u) != SLUICE_PROXY_LO_NET)
		return 0;
	return a & 0xffffu;
}

/* The orig_dst key of a captured connection: its netns, the app's end
 * (address, port: network order) and proxy_lo of the proxy's end. */
static __always_inline void orig_key(struct sluice_orig_key *k, __u64 cookie, const struct sa_addr *app,
				     __u16 app_port, __u16 proxy_lo)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->netns_cookie = cookie;
	__builtin_memcpy(k->addr, app->a, 16);
	k->port = app_port;
	k->family = app->family;
	k->proxy_lo = proxy_lo;
}

/* Whether the proxy's IPv6 listener on port (host order) is in
 * sock_listeners, where pod_sk_lookup finds it: one a proxy opened while
 * this build's pod_sockops ran (an earlier build kept only the inbound
 * one). */
static __always_inline int proxy_listener_known6(__u64 cookie, __u16 port)
{
	struct sluice_sock_listener_key k = { .netns_cookie = cookie, .port = port, .family = AF_INET6 };
	struct bpf_sock *sk;
	int i;

#pragma unroll
	for (i = 0; i < SLUICE_LISTENER_SLOTS; i++) {
		k.slot = i;
		sk = bpf_map_lookup_elem(&sock_listeners, &k);
		if (sk) {
			bpf_sk_release(sk);
			return 1;
		}
	}
	return 0;
}

/*
 * Where a captured TCP socket goes: the proxy's port on loopback, from the
 * pod's address. A connection's ephemeral port is chosen among those free
 * for its destination, and every connection the app closes first holds its
 * port in TIME_WAIT: at the pod's own address for 60 s, over loopback only
 * until the kernel may reuse it (net.ipv4.tcp_tw_reuse = 2, the default, is
 * for loopback; after a second). Sent to one address and port, all of a
 * pod's outbound connections would share one space of ~28k ports; IPv4
 * spreads them over 127.1.0.0/16 by original destination (loopback_for),
 * IPv6 (one loopback address) over a block of ports of ::1
 * (loopback_port_for), which pod_sk_lookup hands to the proxy's outbound
 * listener -- once that listener is known there (a proxy that started
 * listening before this build ran gets [::1]:15001). The source stays the
 * app's: a socket bound to an address keeps it, an unbound one is bound to
 * the pod's address (as Istio's REDIRECT leaves the app's source; the
 * accepted socket's peer is what SO_ORIGINAL_DST is filed under). A socket
 * bound to a device, or to the wildcard with a port (its source would
 * become loopback), or in a pod without an address of the family goes to
 * the pod's own address (or loopback) as before. Returns the port (network
 * order).
 */
static __always_inline __be16 capture_target(struct bpf_sock_addr *ctx, const struct sctx *c,
					     const struct bpf_sock *sk, const struct sa_addr *d, __u32 *to,
					     const int v6)
{
	struct sa_addr bound;
	__u32 dev = sk->bound_dev_if, port = sk->src_port;
	__u8 family = d->family;
	int has_addr; /* bound to an address of the family (never loopback: pod_connect left those) */

	sa_read_bound(sk, &bound);
	has_addr = bound.family == family && !sa_is_any(&bound);
	if (!dev && (has_addr || (sa_is_any(&bound) && !port && bind_pod_source(ctx, c, family, v6)))) {
		sa_set_loopback(to, family);
		if (family == AF_INET) {
			to[0] = loopback_for(d);
		} else if (proxy_listener_known6(c->cookie, c->cfg->outbound_port)) {
			return bpf_htons(loopback_port_for(d));
		}
		return bpf_htons(c->cfg->outbound_port);
	}
	if (has_addr)
		__builtin_memcpy(to, bound.a, 16);
	else if (!pod_addr(c->pod, family, to))
		sa_set_loopback(to, family);
	return bpf_htons(c->cfg->outbound_port);
}

/*
 * Rules 2 and 3 at connect() (and sendmsg()): to the DNS listener, which is
 * bound to loopback. An unbound socket is bound to the pod's address first,
 * so the listener sees the pod as its client, as with Istio's REDIRECT.
 */
static __always_inline int dns_to_listener(struct bpf_sock_addr *ctx, const struct sctx *c, const struct sa_addr *d,
					   int bind, const int v6)
{
	struct sluice_sock_orig *o = bpf_sk_storage_get(&sock_orig, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	struct sa_addr bound;
	__u32 lo[4];

	/* Without the record the answer could not be given the resolver's
	 * address back: refuse rather than confuse the app. */
	if (!o)
		return 0;
	orig_set(o, d, SLUICE_SOCK_DNS);
	sa_read_bound(ctx->sk, &bound);
	if (bind && sa_is_any(&bound))
		bind_pod_source(ctx, c, d->family, v6);
	sa_set_loopback(lo, d->family);
	sa_write_user(ctx, lo, d->family, bpf_htons(c->cfg->dns_port), v6);
	return 1;
}

static __always_inline int pod_connect(struct bpf_sock_addr *ctx, const int v6)
{
	struct bpf_sock *sk = ctx->sk;
	struct sluice_sock_orig *o;
	struct sa_addr d, bound;
	struct sctx c;
	__u32 type = ctx->type, proto = ctx->protocol;
	__u32 to[4];
	__be16 to_port;

	if (!sk || (type != SOCK_STREAM && type != SOCK_DGRAM))
		return 1;
	if (!sctx_init(&c, ctx) || sock_is_proxy(c.cfg, sk))
		return 1;
	sa_read_user(ctx, &d, v6);
	/* Rule 5: the destination is this pod (loopback, the wildcard address
	 * that Linux reads as "this host", the pod's own address) or the probe
	 * address. */
	if (sa_is_any(&d) || sa_is_loopback(&d))
		return 1;

	if (type == SOCK_DGRAM) {
		/* Rule 3; other UDP is not touched (rule 5). */
		if (proto != IPPROTO_UDP || d.port != bpf_htons(53) || !(c.pod->flags & SLUICE_POD_DNS_CAPTURE) ||
		    pod_owns(c.pod, &d))
			return 1;
		if (!dns_to_listener(ctx, &c, &d, 1, v6))
			return 0;
		SLUICE_COUNT(c.cookie, dns_udp_queries);
		return 1;
	}
	/* TCP; MPTCP starts as TCP and the proxy's listener takes it as TCP. */
	if (proto != IPPROTO_TCP && proto != IPPROTO_MPTCP)
		return 1;
	if (pod_owns(c.pod, &d) || sa_is_probe(c.cfg, &d))
		return 1;
	/* A socket bound to loopback cannot reach another host: nothing to
	 * capture, the kernel answers as it would. */
	sa_read_bound(sk, &bound);
	if (sa_is_loopback(&bound))
		return 1;
	if (d.port == bpf_htons(53) && (c.pod->flags & SLUICE_POD_DNS_CAPTURE)) {
		if (!dns_to_listener(ctx, &c, &d, 1, v6))
			return 0;
		SLUICE_COUNT(c.cookie, dns_tcp_conns); /* rule 2 */
		return 1;
	}

	/* Rule 1. The original destination goes on the socket; pod_sockops
	 * files it under the app's address and port once the kernel chose
	 * them, for the proxy's SO_ORIGINAL_DST. No record, no capture: the
	 * connect() fails (EPERM) rather than reaching the proxy unexplained. */
	o = bpf_sk_storage_get(&sock_orig, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!o)
		return 0;
	orig_set(o, &d, SLUICE_SOCK_OUTBOUND);
	to_port = capture_target(ctx, &c, sk, &d, to, v6);
	sa_write_user(ctx, to, d.family, to_port, v6);
	SLUICE_COUNT(c.cookie, outbound_conns);
	return 1;
}

SEC("cgroup/connect4")
int pod_connect4(struct bpf_sock_addr *ctx)
{
	return pod_connect(ctx, 0);
}

SEC("cgroup/connect6")
int pod_connect6(struct bpf_sock_addr *ctx)
{
	return pod_connect(ctx, 1);
}

/* Rule 3 for unconnected UDP sockets (sendto): to the DNS listener, from
 * the pod's address when the socket is not bound. */
static __always_inline int pod_sendmsg(struct bpf_sock_addr *ctx, const int v6)
{
	struct bpf_sock *sk = ctx->sk;
	struct sa_addr d;
	struct sctx c;
	__u32 self[4];

	if (!sk || ctx->type != SOCK_DGRAM)
		return 1;
	if (!sctx_init(&c, ctx) || !(c.pod->flags & SLUICE_POD_DNS_CAPTURE) || sock_is_proxy(c.cfg, sk))
		return 1;
	sa_read_user(ctx, &d, v6);
	if (d.port != bpf_htons(53) || sa_is_any(&d) || sa_is_loopback(&d) || pod_owns(c.pod, &d))
		return 1;
	if (!dns_to_listener(ctx, &c, &d, 0, v6))
		return 0;
	if (pod_addr(c.pod, d.family, self)) {
		if (!v6) {
			if (ctx->msg_src_ip4 == 0)
				sa_store(ctx->msg_src_ip4, self[0]);
		} else if ((ctx->msg_src_ip6[0] | ctx->msg_src_ip6[1] | ctx->msg_src_ip6[2] | ctx->msg_src_ip6[3]) == 0 &&
			   d.family == AF_INET6) {
			sa_store(ctx->msg_src_ip6[0], self[0]);
			sa_store(ctx->msg_src_ip6[1], self[1]);
			sa_store(ctx->msg_src_ip6[2], self[2]);
			sa_store(ctx->msg_src_ip6[3], self[3]);
		}
	}
	SLUICE_COUNT(c.cookie, dns_udp_queries);
	return 1;
}

SEC("cgroup/sendmsg4")
int pod_sendmsg4(struct bpf_sock_addr *ctx)
{
	return pod_sendmsg(ctx, 0);
}

SEC("cgroup/sendmsg6")
int pod_sendmsg6(struct bpf_sock_addr *ctx)
{
	return pod_sendmsg(ctx, 1);
}

/* The original destination of a socket the programs sent to a listener,
 * while it is still connected there; 0 otherwise. */
static __always_inline struct sluice_sock_orig *captured(struct bpf_sock_addr *ctx, const struct sluice_settings *cfg,
							 const struct sa_addr *now)
{
	struct sluice_sock_orig *o = bpf_sk_storage_get(&sock_orig, ctx->sk, 0, 0);

	if (!o)
		return 0;
	if (o->kind == SLUICE_SOCK_DNS)
		return now->port == bpf_htons(cfg->dns_port) && sa_is_loopback(now) ? o : 0;
	if (o->kind != SLUICE_SOCK_OUTBOUND)
		return 0;
	if (now->port == bpf_htons(cfg->outbound_port) || (now->family == AF_INET6 && proxy_lo_of(now)))
		return o;
	return 0;
}

/* Rules 1-3: the app sees its real peer. */
static __always_inline int pod_getpeername(struct bpf_sock_addr *ctx, const int v6)
{
	const struct sluice_settings *cfg = settings_get();
	struct sluice_sock_orig *o;
	struct sa_addr now;
	__u32 a[4];

	if (!cfg || !ctx->sk)
		return 1;
	sa_read_user(ctx, &now, v6);
	o = captured(ctx, cfg, &now);
	if (!o)
		return 1;
	__builtin_memcpy(a, o->addr, 16);
	sa_write_user(ctx, a, o->family, o->port, v6);
	return 1;
}

SEC("cgroup/getpeername4")
int pod_getpeername4(struct bpf_sock_addr *ctx)
{
	return pod_getpeername(ctx, 0);
}

SEC("cgroup/getpeername6")
int pod_getpeername6(struct bpf_sock_addr *ctx)
{
	return pod_getpeername(ctx, 1);
}

/* Rules 2 and 3, the answer: it comes from the resolver the app asked. */
static __always_inline int pod_recvmsg(struct bpf_sock_addr *ctx, const int v6)
{
	const struct sluice_settings *cfg = settings_get();
	struct sluice_sock_orig *o;
	struct sa_addr from;
	__u64 cookie;
	__u32 a[4];

	if (!cfg || !ctx->sk)
		return 1;
	sa_read_user(ctx, &from, v6);
	o = captured(ctx, cfg, &from);
	if (!o || o->kind != SLUICE_SOCK_DNS)
		return 1;
	__builtin_memcpy(a, o->addr, 16);
	sa_write_user(ctx, a, o->family, o->port, v6);
	cookie = bpf_get_netns_cookie(ctx);
	SLUICE_COUNT(cookie, dns_answers);
	return 1;
}

SEC("cgroup/recvmsg4")
int pod_recvmsg4(struct bpf_sock_addr *ctx)
{
	return pod_recvmsg(ctx, 0);
}

SEC("cgroup/recvmsg6")
int pod_recvmsg6(struct bpf_sock_addr *ctx)
{
	return pod_recvmsg(ctx, 1);
}

/*
 * Rule 1, the proxy's side: SO_ORIGINAL_DST on a socket its outbound
 * listener accepted, as Istio's REDIRECT answers it (ztunnel asks it before
 * falling back to the local address). The kernel's own answer came first
 * (no NAT: an error); the program replaces it. The entry filed by the app's
 * address moves onto the accepted socket at the first ask.
 */
SEC("cgroup/getsockopt")
int pod_getsockopt(struct bpf_sockopt *ctx)
{
	const struct sluice_settings *cfg;
	struct sluice_sock_orig *o, *filed;
	struct sluice_orig_key k;
	struct bpf_sock *sk;
	struct sa_addr peer, self;
	__u8 *p;

	if (ctx->optname != SLUICE_SO_ORIGINAL_DST || (ctx->level != SLUICE_SOL_IP && ctx->level != SLUICE_SOL_IPV6))
		return 1;
	sk = ctx->sk;
	cfg = settings_get();
	if (!sk || !cfg || sk->protocol != IPPROTO_TCP ||
	    (sk->src_port != cfg->outbound_port && !(sk->family == AF_INET6 && is_proxy_lo6_port(sk->src_port))))
		return 1;
	o = bpf_sk_storage_get(&sock_orig, sk, 0, 0);
	if (!o || o->kind != SLUICE_SOCK_ACCEPTED) {
		sa_read_peer(sk, &peer);
		sa_read_bound(sk, &self);
		self.port = bpf_htons((__u16)sk->src_port);
		orig_key(&k, bpf_get_netns_cookie(ctx), &peer, peer.port, proxy_lo_of(&self));
		filed = bpf_map_lookup_elem(&orig_dst, &k);
		if (!filed && k.proxy_lo) {
			/* Filed by the sockops program of an earlier build, in the
			 * moment of an upgrade between their switches. */
			k.proxy_lo = 0;
			filed = bpf_map_lookup_elem(&orig_dst, &k);
		}
		if (!filed)
			return 1; /* not captured here: the kernel's answer stands */
		o = bpf_sk_storage_get(&sock_orig, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (o) {
			*o = *filed;
			o->kind = SLUICE_SOCK_ACCEPTED;
			bpf_map_delete_elem(&orig_dst, &k);
		} else {
			o = filed;
		}
	}
	p = ctx->optval;
	if (ctx->level == SLUICE_SOL_IP && o->family == AF_INET) {
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = o->port };

		__builtin_memcpy(&sin.sin_addr, o->addr, 4);
		if (p + sizeof(sin) > (__u8 *)ctx->optval_end)
			return 1;
		__builtin_memcpy(p, &sin, sizeof(sin));
		ctx->optlen = sizeof(sin);
	} else if (ctx->level == SLUICE_SOL_IPV6 && o->family == AF_INET6) {
		struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6, .sin6_port = o->port };

		__builtin_memcpy(&sin6.sin6_addr, o->addr, 16);
		if (p + sizeof(sin6) > (__u8 *)ctx->optval_end)
			return 1;
		__builtin_memcpy(p, &sin6, sizeof(sin6));
		ctx->optlen = sizeof(sin6);
	} else {
		return 1; /* the other family's option: the kernel's answer stands */
	}
	/* optlen and retval are adjacent: two stores, not a merged 8-byte one
	 * the verifier refuses. */
	asm volatile("" ::: "memory");
	ctx->retval = 0;
	return 1;
}

/* The cgroup (v2) of the current task, through the kernel's structures:
 * sock_ops programs may not call bpf_get_current_cgroup_id before Linux
 * 6.x. CO-RE reads (bpf_probe_read_kernel, root). */
struct kernfs_node___sluice {
	__u64 id;
} __attribute__((preserve_access_index));
struct cgroup___sluice {
	struct kernfs_node___sluice *kn;
} __attribute__((preserve_access_index));
struct css_set___sluice {
	struct cgroup___sluice *dfl_cgrp;
} __attribute__((preserve_access_index));
struct task_struct___sluice {
	struct css_set___sluice *cgroups;
} __attribute__((preserve_access_index));

static __always_inline __u64 task_cgroup_id(void)
{
	struct task_struct___sluice *t = (void *)bpf_get_current_task();

	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

/* The proxy_conns key of a connection of the proxy's: its own end (the
 * client's address and a port of the proxy's) and the app's. */
static __always_inline void proxy_conn_key(struct sluice_conn_key *k, struct bpf_sock_ops *ops, const struct sa_addr *self,
					   const struct sa_addr *peer)
{
	__builtin_memcpy(k->saddr, self->a, 16);
	__builtin_memcpy(k->daddr, peer->a, 16);
	k->sport = bpf_htons((__u16)ops->local_port);
	k->dport = peer->port;
	k->family = self->family;
}

/* What a proxy_conns entry holds: the filing socket's cookie (low half,
 * never 0), so that only that socket's end removes it. Entries of earlier
 * builds hold 1 and have no end: they age out of the LRU. */
static __always_inline __u32 proxy_conn_tag(struct bpf_sock_ops *ops)
{
	return (__u32)bpf_get_socket_cookie(ops) | 0x80000000u;
}

/* Rule 4: the proxy connects to one of its pod's apps from a foreign
 * address (the client's): file the connection for pod_sk_lookup, which
 * would otherwise take its SYN for a client's. The entry lives as long as
 * the proxy's socket: the socket gets the state callback, and its move to
 * TCP_CLOSE (the end of the connection, its TIME_WAIT, a failed or reset
 * connect) removes the entry (proxy_conn_closed). A stale entry would let a
 * later SYN from the same client address and port past the proxy to the
 * app. No callback, no filing (an entry nothing would remove): the
 * proxy's SYN then goes to its own inbound listener like a client's, the
 * connection fails and nothing reaches the app around the proxy. */
static __always_inline void file_proxy_conn(struct bpf_sock_ops *ops, struct bpf_sock *sk)
{
	const struct sluice_settings *cfg = settings_get();
	const struct sluice_pod_sock *pod;
	struct sluice_conn_key k;
	struct sa_addr self, peer;
	__u32 tag;

	if (!cfg || (sk->mark & cfg->mark_mask) != cfg->proxy_mark)
		return;
	__builtin_memset(&k, 0, sizeof(k));
	k.netns_cookie = bpf_get_netns_cookie(ops);
	pod = bpf_map_lookup_elem(&pod_sock, &k.netns_cookie);
	if (!pod)
		return;
	sa_read_bound(sk, &self);
	sa_read_peer(sk, &peer);
	if (!pod_owns(pod, &peer) || pod_owns(pod, &self) || sa_is_loopback(&self))
		return;
	if (!cgroup_is_proxy(task_cgroup_id()))
		return;
	proxy_conn_key(&k, ops, &self, &peer);
	if (bpf_sock_ops_cb_flags_set(ops, ops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG))
		return;
	tag = proxy_conn_tag(ops);
	bpf_map_update_elem(&proxy_conns, &k, &tag, BPF_ANY);
}

/* A socket with the state callback (one pod_sockops filed in proxy_conns)
 * changes state: at TCP_CLOSE its entry goes. The kernel calls this before
 * it unhashes the socket, its addresses and ports still set; often from
 * softirq (the app's last ACK, a reset), so nothing here may depend on the
 * current task. A socket going to TIME_WAIT reaches TCP_CLOSE too (the
 * time-wait sock that replaces it holds only the proxy's end, which no
 * packet towards the app is looked up against); an app's end in TIME_WAIT
 * sends a new SYN on the tuple to the listener look-up again, where
 * pod_sk_lookup, without the entry, hands it to the proxy. */
static __always_inline int proxy_conn_closed(struct bpf_sock_ops *ops)
{
	struct bpf_sock *sk = ops->sk;
	struct sluice_conn_key k;
	struct sa_addr self, peer;
	__u32 *tag;

	if (ops->args[1] != BPF_TCP_CLOSE || !sk)
		return 1;
	__builtin_memset(&k, 0, sizeof(k));
	k.netns_cookie = bpf_get_netns_cookie(ops);
	sa_read_bound(sk, &self);
	sa_read_peer(sk, &peer);
	proxy_conn_key(&k, ops, &self, &peer);
	tag = bpf_map_lookup_elem(&proxy_conns, &k);
	if (tag && *tag == proxy_conn_tag(ops))
		bpf_map_delete_elem(&proxy_conns, &k);
	return 1;
}

/* A connection is leaving (its port is known now). One captured at
 * connect(): file the original destination under the app's address and
 * port, where the proxy's accepted socket will find it as its peer. */
static __always_inline int sockops_connect(struct bpf_sock_ops *ops)
{
	struct bpf_sock *sk = ops->sk;
	struct sluice_sock_orig *o;
	struct sluice_orig_key k;
	struct sa_addr self, proxy;

	if (!sk)
		return 1;
	o = bpf_sk_storage_get(&sock_orig, sk, 0, 0);
	if (!o) {
		file_proxy_conn(ops, sk);
		return 1;
	}
	if (o->kind != SLUICE_SOCK_OUTBOUND)
		return 1;
	sa_read_bound(sk, &self);
	sa_read_peer(sk, &proxy);
	orig_key(&k, bpf_get_netns_cookie(ops), &self, bpf_htons((__u16)ops->local_port), proxy_lo_of(&proxy));
	bpf_map_update_elem(&orig_dst, &k, o, BPF_ANY);
	return 1;
}

/* The proxy starts listening on its inbound or outbound port: keep the
 * socket for pod_sk_lookup (inbound connections, and IPv6 connections
 * pod_connect6 sent to [::1] in the port block). Only the proxy's sockets,
 * by its mark (and its cgroups when known). Listeners in netns that are
 * not enrolled (yet) are kept too: the proxy may listen before its pod is
 * enrolled. */
static __always_inline int sockops_listen(struct bpf_sock_ops *ops)
{
	const struct sluice_settings *cfg = settings_get();
	struct bpf_sock *sk = ops->sk;
	struct sluice_sock_listener_key k;
	__u32 port = ops->local_port;
	int i;

	if (!cfg || !sk || (port != cfg->inbound_port && port != cfg->outbound_port))
		return 1;
	if ((sk->mark & cfg->mark_mask) != cfg->proxy_mark || !cgroup_is_proxy(task_cgroup_id()))
		return 1;
	__builtin_memset(&k, 0, sizeof(k));
	k.netns_cookie = bpf_get_netns_cookie(ops);
	k.port = port;
	k.family = ops->family;
	/* The first free slot (an insert refused as existing moves on). */
#pragma unroll
	for (i = 0; i < SLUICE_LISTENER_SLOTS; i++) {
		k.slot = i;
		if (bpf_sock_hash_update(ops, &sock_listeners, &k, BPF_NOEXIST) == 0)
			break;
	}
	return 1;
}

SEC("sockops")
int pod_sockops(struct bpf_sock_ops *ops)
{
	switch (ops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		return sockops_connect(ops);
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		return sockops_listen(ops);
	case BPF_SOCK_OPS_STATE_CB:
		return proxy_conn_closed(ops);
	}
	return 1;
}

/* Whether the packet belongs to a connection the proxy opened to one of its
 * apps (proxy_conns). */
static __always_inline int is_proxy_conn(struct bpf_sk_lookup *ctx, __u64 cookie, const struct sa_addr *remote)
{
	struct sluice_conn_key k;
	__u32 remote_port = ctx->remote_port;

	__builtin_memset(&k, 0, sizeof(k));
	k.netns_cookie = cookie;
	__builtin_memcpy(k.saddr, remote->a, 16);
	if (ctx->family == AF_INET) {
		__u32 local = ctx->local_ip4;

		__builtin_memcpy(k.daddr, &local, 4);
	} else {
		__u32 l[4] = { ctx->local_ip6[0], ctx->local_ip6[1], ctx->local_ip6[2], ctx->local_ip6[3] };

		__builtin_memcpy(k.daddr, l, 16);
	}
	k.sport = (__u16)remote_port;
	k.dport = bpf_htons((__u16)ctx->local_port);
	k.family = ctx->family;
	return bpf_map_lookup_elem(&proxy_conns, &k) != 0;
}

/* Hands the connection to the proxy's listener on port: one of the
 * sockets registered there (the proxy's own, by pod_sockops: its mark, and
 * its cgroups when known), sockets of the connection's family first, then
 * (IPv4) dual-stack ones; a start slot from a hash of the client's port
 * spreads connections over several. That socket itself, not its reuseport group:
 * any socket of the proxy's uid may join the group (SO_REUSEPORT on the
 * same port), an app's too, and would get a share of the connections.
 * 0 when handed over. */
static __always_inline long to_proxy_listener(struct bpf_sk_lookup *ctx, __u64 cookie, __u16 port)
{
	struct sluice_sock_listener_key k = { .netns_cookie = cookie, .port = port };
	/* Ports of a client's connections are often all even: hashed first. */
	__u32 start = ((ctx->remote_port * 2654435761u) >> 16) % SLUICE_LISTENER_SLOTS;
	struct bpf_sock *sk;
	long err = -1;
	int f, i;

#pragma unroll
	for (f = 0; f < 2; f++) {
		if (f == 1 && ctx->family != AF_INET)
			break;
		k.family = f == 0 ? ctx->family : AF_INET6;
#pragma unroll
		for (i = 0; i < SLUICE_LISTENER_SLOTS; i++) {
			k.slot = (start + i) % SLUICE_LISTENER_SLOTS;
			sk = bpf_map_lookup_elem(&sock_listeners, &k);
			if (!sk)
				continue;
			err = bpf_sk_assign(ctx, sk, BPF_SK_LOOKUP_F_NO_REUSEPORT);
			bpf_sk_release(sk);
			if (err == 0)
				return 0;
		}
	}
	return err;
}

static __always_inline int is_reroute_iface(const struct sluice_pod_sock *pod, __u32 ifindex)
{
	int i;

#pragma unroll
	for (i = 0; i < SLUICE_MAX_REROUTE_IFACES; i++) {
		if (i >= pod->reroute_count)
			break;
		if (pod->reroute_ifindex[i] == ifindex)
			return 1;
	}
	return 0;
}

/*
 * Rule 1 for IPv6 in the pod's netns: a connection pod_connect6 sent to
 * [::1]:P, P in the port block (maps/sluice_maps.h), goes to the proxy's
 * outbound listener. Only a connection filed in orig_dst under its source
 * and P (by pod_sockops, before its SYN left) is one: any other that
 * reaches [::1]:P is an app's own and left to the kernel. Its listener
 * gone: dropped and counted, never left to whatever else listens there.
 * For IPv6 lookups (remote: their source). Returns SK_PASS / SK_DROP, or
 * -1 for "not such a connection".
 */
static __always_inline int to_outbound_lo6(struct bpf_sk_lookup *ctx, const struct sluice_settings *cfg,
					   __u64 cookie, const struct sa_addr *remote)
{
	struct sluice_orig_key k;
	struct sa_addr local;
	__u32 port = ctx->local_port, remote_port = ctx->remote_port;

	if (!is_proxy_lo6_port(port))
		return -1;
	__builtin_memset(&local, 0, sizeof(local));
	local.family = AF_INET6;
	local.a[0] = ctx->local_ip6[0];
	local.a[1] = ctx->local_ip6[1];
	local.a[2] = ctx->local_ip6[2];
	local.a[3] = ctx->local_ip6[3];
	if (!sa_is_loopback(&local))
		return -1;
	orig_key(&k, cookie, remote, (__u16)remote_port, (__u16)port);
	if (!bpf_map_lookup_elem(&orig_dst, &k))
		return -1;
	if (to_proxy_listener(ctx, cookie, cfg->outbound_port) == 0)
		return SK_PASS;
	SLUICE_COUNT(cookie, dropped_pkts);
	return SK_DROP;
}

/*
 * Rules 6-9 in the pod's netns, called (by tail call) from the pod's own
 * program once the kernel found no connected socket for a packet: a new
 * connection from outside goes to the proxy's inbound listener, keeping its
 * addresses (the accepted socket's local address is the original
 * destination). The kernel then picks among the listener's reuseport group.
 * No listener: dropped (the client sees a reset).
 */
SEC("sk_lookup")
int pod_sk_lookup(struct bpf_sk_lookup *ctx)
{
	const struct sluice_settings *cfg;
	const struct sluice_pod_sock *pod;
	struct sluice_lookup_pod *lp;
	struct sa_addr x;
	__u32 zero = 0;
	__u64 cookie;

	lp = bpf_map_lookup_elem(&sk_lookup_pod, &zero);
	if (!lp)
		return SK_DROP;
	cookie = lp->netns_cookie;
	if (ctx->protocol != IPPROTO_TCP) /* rule 9 */
		return SK_PASS;
	cfg = settings_get();
	pod = bpf_map_lookup_elem(&pod_sock, &cookie);
	if (!cfg || !pod)
		return SK_PASS;
	__builtin_memset(&x, 0, sizeof(x));
	x.family = ctx->family;
	if (ctx->family == AF_INET) {
		x.a[0] = ctx->remote_ip4;
	} else {
		int v;

		x.a[0] = ctx->remote_ip6[0];
		x.a[1] = ctx->remote_ip6[1];
		x.a[2] = ctx->remote_ip6[2];
		x.a[3] = ctx->remote_ip6[3];
		v = to_outbound_lo6(ctx, cfg, cookie, &x);
		if (v >= 0)
			return v;
	}
	if (!(pod->flags & SLUICE_POD_INBOUND_CAPTURE))
		return SK_PASS;
	/* Virtual interfaces: their TC hook decided (outbound listener). */
	if (pod->reroute_count && is_reroute_iface(pod, ctx->ingress_ifindex))
		return SK_PASS;
	if (ctx->local_port == cfg->hbone_port) /* rule 7 */
		return SK_PASS;
	/* Rule 5, from the pod itself: a connection over lo reports the
	 * address's device (eth0), not lo, as its ingress interface, but its
	 * source is the pod's (a packet from outside with a source address of
	 * the pod's is dropped as a martian before any lookup). The proxy's
	 * own connections from a client's address (rule 4) were filed when
	 * they left. */
	if (sa_is_loopback(&x) || pod_owns(pod, &x))
		return SK_PASS;
	if (sa_is_probe(cfg, &x)) /* rule 8 */
		return SK_PASS;
	if (is_proxy_conn(ctx, cookie, &x))
		return SK_PASS;

	if (to_proxy_listener(ctx, cookie, cfg->inbound_port)) /* rule 6 */
		goto drop;
	SLUICE_COUNT(cookie, inbound_conns);
	return SK_PASS;
drop:
	SLUICE_COUNT(cookie, dropped_pkts);
	return SK_DROP;
}

/* The packet's source address (cgroup_skb: the data starts at the IP
 * header), folded as sa_read_user folds (v4-mapped into IPv4). False when
 * it cannot be read. */
static __always_inline int skb_source(struct __sk_buff *skb, struct sa_addr *x)
{
	__builtin_memset(x, 0, sizeof(*x));
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		x->family = AF_INET;
		return bpf_skb_load_bytes(skb, 12, &x->a[0], 4) == 0;
	}
	if (skb->protocol != bpf_htons(ETH_P_IPV6) || bpf_skb_load_bytes(skb, 8, x->a, 16) < 0)
		return 0;
	x->family = AF_INET6;
	if (v6_is_mapped(x->a[0], x->a[1], x->a[2])) {
		x->family = AF_INET;
		x->a[0] = x->a[3];
		x->a[1] = x->a[2] = x->a[3] = 0;
	}
	return 1;
}

/*
 * Rule 5's other side: pod_sk_lookup lets a connection from one of the
 * pod's own addresses through, since the pod calling itself over lo reports
 * the address's device (eth0) as its ingress interface. Only lo carries
 * those: a packet to a listener of the pod that came in on any other device
 * with the pod's own address as source is forged. IPv4 drops it as a
 * martian before any lookup (unless accept_local is set); IPv6 does not,
 * and would hand a blind attacker the app's listener around the proxy.
 * Dropped and counted here, where the real device is known; so is a packet
 * whose source cannot be read. Virtual interfaces the pod's TC hook serves
 * (reroute) decided there. 1: pass.
 */
static __always_inline int foreign_own_source_ok(struct __sk_buff *skb)
{
	const struct sluice_pod_sock *pod;
	struct sa_addr x;
	__u64 cookie;

	cookie = pod_cookie(skb);
	pod = bpf_map_lookup_elem(&pod_sock, &cookie);
	if (!pod)
		return 1;
	if (skb_source(skb, &x)) {
		if (!pod_owns(pod, &x))
			return 1;
		if (pod->reroute_count && is_reroute_iface(pod, skb->ifindex))
			return 1;
	}
	SLUICE_COUNT(cookie, dropped_pkts);
	return 0;
}

/*
 * Rule 4. The proxy connects to an app with the client's address (its
 * socket transparent and marked): the app's answer to that address must
 * come back to the proxy, not leave the pod. Istio restores a connmark
 * 0x111 on the replies; here the SYN that reaches the app's listener gets
 * the return mark, which net.ipv4.tcp_fwmark_accept (set in the pod's
 * netns) makes the mark of the app's accepted socket: its SYN-ACK and every
 * later reply take the policy route "fwmark 0x111 -> local".
 *
 * And rule 5's forged side (foreign_own_source_ok). Both concern packets
 * to a listening socket only (SYNs, the ACKs of a handshake): what almost
 * every packet is delivered to, a connected socket, is passed after two
 * loads.
 */
SEC("cgroup_skb/ingress")
int pod_skb_ingress(struct __sk_buff *skb)
{
	const struct sluice_settings *cfg;
	struct bpf_sock *sk = skb->sk;
	__u32 mark;
	__u64 cookie;

	if (!sk || sk->state != BPF_TCP_LISTEN)
		return 1;
	if (skb->ifindex != SLUICE_LOOPBACK_IFINDEX && !foreign_own_source_ok(skb))
		return 0;
	mark = skb->mark;
	if (!mark)
		return 1;
	cfg = settings_get();
	if (!cfg || (mark & cfg->mark_mask) != cfg->proxy_mark)
		return 1;
	cookie = pod_cookie(skb);
	if (!bpf_map_lookup_elem(&pod_sock, &cookie))
		return 1;
	skb->mark = (mark & ~cfg->mark_mask) | cfg->return_mark;
	return 1;
}

/*
 * Fail closed on raw sockets: connect() is where the socket mode captures
 * TCP, and a raw socket (CAP_NET_RAW, which containers have by default)
 * builds TCP without one. The raw sockets apps of an enrolled pod open are
 * tagged when created (the kernel's own, such as the TCP control socket
 * that sends resets, are not: the hook runs only for sockets a process
 * creates); TCP from a tagged one leaving the pod is dropped and counted.
 * ICMP (ping) and UDP from raw sockets pass, as the TC mode passes them.
 * Raw sockets opened before their pod was enrolled are not tagged, and
 * packet sockets (AF_PACKET) pass no cgroup hook (as they pass no netfilter
 * hook of Istio's): only the TC mode sees those.
 */
SEC("cgroup/sock_create")
int pod_sock_create(struct bpf_sock *sk)
{
	struct sluice_sock_orig *o;
	__u64 cookie;

	if (sk->type != SOCK_RAW)
		return 1;
	cookie = bpf_get_netns_cookie(sk);
	if (!bpf_map_lookup_elem(&pod_sock, &cookie))
		return 1;
	o = bpf_sk_storage_get(&sock_orig, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!o)
		return 0; /* cannot be watched: refused (EPERM) */
	o->kind = SLUICE_SOCK_RAW;
	return 1;
}

/* An IPv4 packet's options (after the 20-byte header) hold a source route
 * (loose or strict): the packet goes to the first hop, its destination is
 * in the option. Options that cannot be walked count as one. The walk is a
 * bpf_loop callback (5.17+, as the socket mode needs anyway): verified
 * once, where an open loop's paths multiply past the verifier's limit. */
struct ipv4_opts {
	__u8 opt[64]; /* 40 at most; indexed masked, which the verifier follows */
	__u32 len;
	__u32 i;
	int srcroute;
};

static long ipv4_opt_step(__u32 n, void *ctx)
{
	struct ipv4_opts *o = ctx;
	__u32 i = o->i;
	__u8 t, l;

	if (i >= o->len)
		return 1;
	t = o->opt[i & 63];
	if (t == 0) /* end of the list */
		return 1;
	if (t == 1) { /* no-op */
		o->i = i + 1;
		return 0;
	}
	l = o->opt[(i + 1) & 63];
	if (t == 0x83 || t == 0x89 || l < 2 || i + 1 >= o->len) { /* LSRR, SSRR, or unreadable */
		o->srcroute = 1;
		return 1;
	}
	o->i = i + l;
	return 0;
}

static __always_inline int ipv4_srcroute(struct __sk_buff *skb, __u32 ihl)
{
	struct ipv4_opts o;

	if (ihl <= 5)
		return 0;
	__builtin_memset(&o, 0, sizeof(o));
	o.len = ihl * 4 - 20;
	if (o.len > 40 || bpf_skb_load_bytes(skb, 20, o.opt, o.len) < 0)
		return 1;
	bpf_loop(40, ipv4_opt_step, &o, 0);
	return o.srcroute;
}

static __always_inline int flow_is_loopback(const struct flow *f)
{
	return addr_is_loopback(f->saddr, f->family) || addr_is_loopback(f->daddr, f->family);
}

static __always_inline int flow_to_probe(const struct sluice_settings *cfg, const struct flow *f)
{
	if (f->family == AF_INET)
		return f->daddr[0] == cfg->probe_v4;
	const __u32 *p6 = (const __u32 *)cfg->probe_v6;

	return ((f->daddr[0] ^ p6[0]) | (f->daddr[1] ^ p6[1]) | (f->daddr[2] ^ p6[2]) | (f->daddr[3] ^ p6[3])) == 0;
}

/*
 * The guard at the pod's interfaces: what leaves an enrolled pod through
 * an interface other than lo, sent by one of its apps' sockets, that the
 * socket hooks would have captured or cannot have judged. Captured traffic
 * never takes this way (it goes to the proxy over lo), so whatever does
 * slipped past the decision at connect()/sendmsg():
 *  - from a raw socket the pod's app opened (tagged by pod_sock_create):
 *    TCP, DNS (UDP to port 53, DNS capture on), and what cannot be told
 *    (fragments, extension headers past the walk) -- a raw socket builds
 *    its packets without passing the hooks at all;
 *  - from any app socket: a loopback source or destination (a socket bound
 *    to 127.0.0.1 or ::1 that connected out), a source route (IP_OPTIONS
 *    LSRR/SSRR, an IPv6 routing header: the decision saw the final address,
 *    the packet goes to the first hop), a TCP connection still opening
 *    (SYN_SENT) to anything but the probe address (rule 1 sends every other
 *    one to the proxy over lo), UDP to port 53 (DNS capture on: a socket
 *    connected to the resolver before the pod was enrolled sends without
 *    passing sendmsg).
 * Dropped and counted. Sockets of the proxy (its mark, and its cgroups
 * when known) pass; so do the kernel's own (request and time-wait socks,
 * its control sockets, which carry no tag) and established connections,
 * which were decided when they began.
 */
SEC("cgroup_skb/egress")
int pod_skb_egress(struct __sk_buff *skb)
{
	const struct sluice_settings *cfg;
	const struct sluice_pod_sock *pod;
	struct sluice_sock_orig *o;
	struct bpf_sock *sk = skb->sk;
	struct flow f;
	__u64 cookie;
	__u8 vhl;
	int r, raw, escapes;

	if (!sk || skb->ifindex == SLUICE_LOOPBACK_IFINDEX)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1;
	cfg = settings_get();
	if (!cfg)
		return 1;
	raw = sk->type == SOCK_RAW;
	if (raw) {
		o = bpf_sk_storage_get(&sock_orig, sk, 0, 0);
		if (!o || o->kind != SLUICE_SOCK_RAW)
			return 1;
	} else if ((sk->mark & cfg->mark_mask) == cfg->proxy_mark && proxy_marked_is_proxy(skb)) {
		return 1;
	}
	__builtin_memset(&f, 0, sizeof(f));
	if (load_hdr(skb, 0, &vhl, 1) < 0) {
		r = PARSE_DROP;
	} else if ((vhl >> 4) == 4) {
		r = parse_ipv4(skb, &f);
		if (ipv4_srcroute(skb, vhl & 0xf))
			f.srcroute = 1;
	} else if ((vhl >> 4) == 6) {
		r = parse_ipv6(skb, &f);
	} else {
		r = raw ? PARSE_DROP : PARSE_OTHER;
	}
	if (r == PARSE_OK && f.proto == IPPROTO_UDP && load_hdr(skb, f.l4_off + 2, &f.dport, 2) < 0)
		r = PARSE_DROP;

	escapes = r == PARSE_DROP || f.srcroute || flow_is_loopback(&f);
	if (raw)
		escapes = escapes || f.proto == IPPROTO_TCP;
	else if (sk->protocol == IPPROTO_TCP)
		escapes = escapes || (sk->state == BPF_TCP_SYN_SENT && !flow_to_probe(cfg, &f));
	if (!escapes && !(r == PARSE_OK && f.proto == IPPROTO_UDP && f.dport == bpf_htons(53)))
		return 1;
	/* Rare from here on: the pod (and its DNS setting) decides. */
	cookie = pod_cookie(skb);
	pod = bpf_map_lookup_elem(&pod_sock, &cookie);
	if (!pod)
		return 1;
	if (!escapes && !(pod->flags & SLUICE_POD_DNS_CAPTURE))
		return 1;
	SLUICE_COUNT(cookie, dropped_pkts);
	return 0;
}
