/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Addresses as the socket programs see them: what an app passes to
 * connect()/sendmsg() or gets from getpeername()/recvmsg() (struct
 * bpf_sock_addr), read and rewritten with IPv4-mapped IPv6 folded into
 * IPv4; a socket's own ends (struct bpf_sock); and the tests of rule 5
 * (loopback, the pod itself, the probe address). */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "maps/sluice_maps.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* An address and port (both network byte order). IPv4, and IPv4-mapped
 * IPv6 (mapped = 1), keep the address in a[0] with family AF_INET. */
struct sa_addr {
	__u32 a[4];
	__u16 port;
	__u8 family;
	__u8 mapped;
};

static __always_inline int v6_is_mapped(__u32 a0, __u32 a1, __u32 a2)
{
	return a0 == 0 && a1 == 0 && a2 == bpf_htonl(0xffff);
}

/* The address the app passed (connect, sendmsg) or is about to get
 * (getpeername, recvmsg). @p v6 is the program's family, a constant: a
 * program of the other family may not even name the other fields.
 * user_port allows only 4-byte reads on older kernels; its low 16 bits are
 * the port in network byte order. */
static __always_inline void sa_read_user(struct bpf_sock_addr *ctx, struct sa_addr *x, const int v6)
{
	__u32 port = ctx->user_port;
	__u32 a0, a1, a2, a3;

	__builtin_memset(x, 0, sizeof(*x));
	x->port = (__u16)port;
	if (!v6) {
		x->family = AF_INET;
		x->a[0] = ctx->user_ip4;
		return;
	}
	a0 = ctx->user_ip6[0];
	a1 = ctx->user_ip6[1];
	a2 = ctx->user_ip6[2];
	a3 = ctx->user_ip6[3];
	if (v6_is_mapped(a0, a1, a2)) {
		x->family = AF_INET;
		x->mapped = 1;
		x->a[0] = a3;
		return;
	}
	x->family = AF_INET6;
	x->a[0] = a0;
	x->a[1] = a1;
	x->a[2] = a2;
	x->a[3] = a3;
}

/* A 4-byte store into the context that the compiler may not merge with
 * its neighbour (the verifier allows only 4-byte accesses there). */
#define sa_store(field, v) (*(volatile __u32 *)&(field) = (v))

/* Rewrites the address the app passed or gets. An IPv4 address given to an
 * IPv6 socket's context becomes v4-mapped. */
static __always_inline void sa_write_user(struct bpf_sock_addr *ctx, const __u32 *a, __u8 family, __u16 port,
					  const int v6)
{
	if (!v6) {
		sa_store(ctx->user_ip4, a[0]);
	} else if (family == AF_INET) {
		sa_store(ctx->user_ip6[0], 0);
		sa_store(ctx->user_ip6[1], 0);
		sa_store(ctx->user_ip6[2], bpf_htonl(0xffff));
		sa_store(ctx->user_ip6[3], a[0]);
	} else {
		sa_store(ctx->user_ip6[0], a[0]);
		sa_store(ctx->user_ip6[1], a[1]);
		sa_store(ctx->user_ip6[2], a[2]);
		sa_store(ctx->user_ip6[3], a[3]);
	}
	sa_store(ctx->user_port, port);
}

/* Keeps the compiler from turning loads of a socket's fields into pointer
 * arithmetic on the socket, which the verifier refuses. */
#define sa_barrier(v) asm volatile("" : "+r"(v))

/* Folds four words read from a socket into x. */
static __always_inline void sa_fold(struct sa_addr *x, __u32 family, __u32 v4, __u32 a0, __u32 a1, __u32 a2,
				    __u32 a3)
{
	__builtin_memset(x, 0, sizeof(*x));
	if (family == AF_INET) {
		x->family = AF_INET;
		x->a[0] = v4;
	} else if (v6_is_mapped(a0, a1, a2)) {
		x->family = AF_INET;
		x->mapped = 1;
		x->a[0] = a3;
	} else {
		x->family = AF_INET6;
		x->a[0] = a0;
		x->a[1] = a1;
		x->a[2] = a2;
		x->a[3] = a3;
	}
}

/* The address a socket is bound to (its local end), folded like
 * sa_read_user; port not set. */
static __always_inline void sa_read_bound(const struct bpf_sock *sk, struct sa_addr *x)
{
	__u32 family = sk->family, v4 = sk->src_ip4;
	__u32 a0 = sk->src_ip6[0], a1 = sk->src_ip6[1], a2 = sk->src_ip6[2], a3 = sk->src_ip6[3];

	sa_barrier(v4);
	sa_barrier(a0);
	sa_barrier(a1);
	sa_barrier(a2);
	sa_barrier(a3);
	sa_fold(x, family, v4, a0, a1, a2, a3);
}

/* A socket's peer (remote end), folded; port in network byte order. */
static __always_inline void sa_read_peer(const struct bpf_sock *sk, struct sa_addr *x)
{
	__u32 family = sk->family, v4 = sk->dst_ip4, port = sk->dst_port;
	__u32 a0 = sk->dst_ip6[0], a1 = sk->dst_ip6[1], a2 = sk->dst_ip6[2], a3 = sk->dst_ip6[3];

	sa_barrier(v4);
	sa_barrier(a0);
	sa_barrier(a1);
	sa_barrier(a2);
	sa_barrier(a3);
	sa_fold(x, family, v4, a0, a1, a2, a3);
	x->port = (__u16)port;
}

static __always_inline int sa_is_any(const struct sa_addr *x)
{
	if (x->family == AF_INET)
		return x->a[0] == 0;
	return (x->a[0] | x->a[1] | x->a[2] | x->a[3]) == 0;
}

static __always_inline int sa_is_loopback(const struct sa_addr *x)
{
	if (x->family == AF_INET)
		return (x->a[0] & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
	return x->a[0] == 0 && x->a[1] == 0 && x->a[2] == 0 && x->a[3] == bpf_htonl(1);
}

static __always_inline void sa_set_loopback(__u32 *a, __u8 family)
{
	a[0] = family == AF_INET ? bpf_htonl(0x7f000001) : 0;
	a[1] = 0;
	a[2] = 0;
	a[3] = family == AF_INET ? 0 : bpf_htonl(1);
}

static __always_inline int sa_is_probe(const struct sluice_settings *cfg, const struct sa_addr *x)
{
	const __u32 *p6 = (const __u32 *)cfg->probe_v6;

	if (x->family == AF_INET)
		return x->a[0] == cfg->probe_v4;
	return x->a[0] == p6[0] && x->a[1] == p6[1] && x->a[2] == p6[2] && x->a[3] == p6[3];
}

/* One of the pod's own addresses (rule 5: not captured, the traffic stays
 * on lo). */
static __always_inline int pod_owns(const struct sluice_pod_sock *pod, const struct sa_addr *x)
{
	int i;

	if (x->family == AF_INET) {
#pragma unroll
		for (i = 0; i < SLUICE_SOCK_POD_ADDRS; i++)
			if (i < pod->v4_count && pod->v4[i] == x->a[0])
				return 1;
		return 0;
	}
#pragma unroll
	for (i = 0; i < SLUICE_SOCK_POD_ADDRS; i++) {
		const __u32 *v = (const __u32 *)pod->v6[i];

		if (i < pod->v6_count && v[0] == x->a[0] && v[1] == x->a[1] && v[2] == x->a[2] && v[3] == x->a[3])
			return 1;
	}
	return 0;
}

/* The pod's first address of the family into a; false when it has none. */
static __always_inline int pod_addr(const struct sluice_pod_sock *pod, __u8 family, __u32 *a)
{
	if (family == AF_INET) {
		if (!pod->v4_count)
			return 0;
		a[0] = pod->v4[0];
		a[1] = a[2] = a[3] = 0;
		return 1;
	}
	if (!pod->v6_count)
		return 0;
	__builtin_memcpy(a, pod->v6[0], 16);
	return 1;
}

/* Stores x into an original-destination record (folded: an IPv6 socket's
 * context gets IPv4 back as v4-mapped from sa_write_user). */
static __always_inline void orig_set(struct sluice_sock_orig *o, const struct sa_addr *x, __u8 kind)
{
	__builtin_memset(o, 0, sizeof(*o));
	__builtin_memcpy(o->addr, x->a, 16);
	o->family = x->family;
	o->port = x->port;
	o->kind = kind;
}
