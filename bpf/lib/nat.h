/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Address and port rewrites with checksum fix-ups (IPv4 header checksum,
 * TCP/UDP checksum including the pseudo-header). */
#pragma once

#include <linux/bpf.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include "parse.h"

static __always_inline __u32 l4_csum_off(const struct flow *f)
{
	return f->l4_off + (f->proto == IPPROTO_TCP ? 16 : 6);
}

/* UDP over IPv4 may carry no checksum (0); BPF_F_MARK_MANGLED_0 keeps it
 * at 0 and turns a computed 0 into 0xffff as RFC 768 wants. */
static __always_inline __u64 l4_csum_flags(const struct flow *f)
{
	return f->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Rewrites the source (is_src) or destination address to addr. */
static __always_inline int nat_rewrite_addr(struct __sk_buff *skb, struct flow *f, int is_src,
					    const __u32 *addr)
{
	__u32 *cur = is_src ? f->saddr : f->daddr;
	__u32 size = f->family == AF_INET ? 4 : 16;
	__u32 off;
	__s64 diff;

	diff = bpf_csum_diff(cur, size, (__u32 *)addr, size, 0);
	if (diff < 0)
		return -1;
	if (f->family == AF_INET) {
		off = f->l3_off + (is_src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));
		if (bpf_l3_csum_replace(skb, f->l3_off + offsetof(struct iphdr, check), 0, diff, 0) < 0)
			return -1;
	} else {
		off = f->l3_off +
		      (is_src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr));
	}
	if (bpf_l4_csum_replace(skb, l4_csum_off(f), 0, diff, BPF_F_PSEUDO_HDR | l4_csum_flags(f)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, off, addr, size, 0) < 0)
		return -1;
	__builtin_memcpy(cur, addr, 16);
	return 0;
}

/* Rewrites the source (is_src) or destination port. */
static __always_inline int nat_rewrite_port(struct __sk_buff *skb, struct flow *f, int is_src,
					    __be16 port)
{
	__be16 *cur = is_src ? &f->sport : &f->dport;
	__u32 off = f->l4_off + (is_src ? 0 : 2);

	if (bpf_l4_csum_replace(skb, l4_csum_off(f), *cur, port, sizeof(port) | l4_csum_flags(f)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, off, &port, sizeof(port), 0) < 0)
		return -1;
	*cur = port;
	return 0;
}

/* Rewrites the source (is_src) or destination address and port. */
static __always_inline int nat_rewrite(struct __sk_buff *skb, struct flow *f, int is_src,
				       const __u32 *addr, __be16 port)
{
	if (nat_rewrite_addr(skb, f, is_src, addr) < 0)
		return -1;
	return nat_rewrite_port(skb, f, is_src, port);
}
