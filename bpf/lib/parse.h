/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing into a flow description: Ethernet, IPv4 (with options),
 * IPv6 (with extension headers), TCP and UDP ports and TCP flags. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* How many IPv6 extension headers we walk before giving up. */
#define SLUICE_MAX_EXT_HDRS 6

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88a8

/*
 * What a frame is, as far as the redirect can judge it. The kernel
 * reassembles fragments and walks IPv6 extension headers only after TC, so
 * whatever the parser cannot see through may still be TCP for the stack:
 * such frames are PARSE_DROP, and the pod programs drop and count them
 * instead of passing them around the proxy (spec: "Fail closed on what
 * cannot be judged").
 */
enum parse_result {
	PARSE_OK = 0,       /* TCP or UDP, whole transport header, not a fragment */
	PARSE_OTHER,        /* not IP, or IP carrying neither TCP nor UDP, or a
			     * UDP fragment after the first: not ours */
	PARSE_DROP,         /* cannot be judged: a fragment of TCP (an IPv6
			     * atomic fragment too), more extension headers
			     * than we walk, a truncated or inconsistent header,
			     * a stacked VLAN tag */
	PARSE_UDP_FRAGMENT, /* the first fragment of a UDP datagram (ports in
			     * f), or a UDP atomic fragment */
};

struct flow {
	__u32 saddr[4]; /* network byte order; IPv4 uses saddr[0] */
	__u32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u8 frag; /* set by the parser: the packet is a first or atomic fragment */
	__u8 srcroute; /* set by the IPv6 parser: a routing header was walked */
	__u32 l3_off;
	__u32 l4_off;
};

/* Copies len bytes at off into to: straight from the linear part of the
 * packet when it holds them (no helper call: most of a program's parsing
 * time went to bpf_skb_load_bytes), else with bpf_skb_load_bytes, which
 * also reads paged data. The bound on off keeps the verifier's packet
 * range arithmetic finite. */
static __always_inline int load_hdr(struct __sk_buff *skb, __u32 off, void *to, __u32 len)
{
	void *data, *end;

	/* Keeps clang from hoisting &skb->data_end out of the inlined copies
	 * into a spilled register: the verifier refuses a load through a
	 * modified context pointer. */
	asm volatile("" : "+r"(skb));
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;

	if (off <= 1024 && data + off + len <= end) {
		__builtin_memcpy(to, data + off, len);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, to, len);
}

/* A fragment after the first: nothing but the protocol to go by. TCP is
 * dropped (its first fragment may have been let through by someone else,
 * and the receiver reassembles); UDP and the rest are the stack's. */
static __always_inline int parse_later_fragment(__u8 proto)
{
	return proto == IPPROTO_TCP ? PARSE_DROP : PARSE_OTHER;
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct flow *f)
{
	struct iphdr ip;

	if (load_hdr(skb, f->l3_off, &ip, sizeof(ip)) < 0)
		return PARSE_DROP;
	if (ip.version != 4 || ip.ihl < 5)
		return PARSE_DROP;
	f->family = AF_INET;
	f->proto = ip.protocol;
	f->saddr[0] = ip.saddr;
	f->daddr[0] = ip.daddr;
	f->l4_off = f->l3_off + ip.ihl * 4;
	if (ip.frag_off & bpf_htons(0x1fff)) /* offset: a later fragment */
		return parse_later_fragment(ip.protocol);
	if (ip.frag_off & bpf_htons(0x2000)) /* MF, offset 0: the first */
		f->frag = 1;
	return PARSE_OK;
}

static __always_inline int parse_ipv6(struct __sk_buff *skb, struct flow *f)
{
	struct ipv6hdr ip6;
	__u32 off = f->l3_off + sizeof(ip6);
	__u8 nexthdr;
	int i;

	if (load_hdr(skb, f->l3_off, &ip6, sizeof(ip6)) < 0)
		return PARSE_DROP;
	if (ip6.version != 6)
		return PARSE_DROP;
	f->family = AF_INET6;
	__builtin_memcpy(f->saddr, &ip6.saddr, 16);
	__builtin_memcpy(f->daddr, &ip6.daddr, 16);
	nexthdr = ip6.nexthdr;

#pragma unroll
	for (i = 0; i < SLUICE_MAX_EXT_HDRS; i++) {
		__u8 hdr[4];

		switch (nexthdr) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			if (nexthdr == IPPROTO_ROUTING)
				f->srcroute = 1;
			if (load_hdr(skb, off, hdr, 2) < 0)
				return PARSE_DROP;
			nexthdr = hdr[0];
			off += (hdr[1] + 1) * 8;
			break;
		case IPPROTO_AH:
			if (load_hdr(skb, off, hdr, 2) < 0)
				return PARSE_DROP;
			nexthdr = hdr[0];
			off += (hdr[1] + 2) * 4;
			break;
		case IPPROTO_FRAGMENT:
			/* Next header, reserved, offset (13 bits) << 3 | M. An
			 * atomic fragment (offset 0, M clear) is a whole packet
			 * to the kernel (ipv6_frag_rcv), the first fragment
			 * starts with the rest of the chain: walk on. */
			if (load_hdr(skb, off, hdr, 4) < 0)
				return PARSE_DROP;
			nexthdr = hdr[0];
			off += 8;
			if ((hdr[2] << 8 | hdr[3]) & 0xfff8) {
				switch (nexthdr) {
				case IPPROTO_HOPOPTS:
				case IPPROTO_ROUTING:
				case IPPROTO_DSTOPTS:
				case IPPROTO_AH:
				case IPPROTO_FRAGMENT:
					return PARSE_DROP; /* the payload's protocol is unknown */
				}
				f->proto = nexthdr;
				return parse_later_fragment(nexthdr);
			}
			f->frag = 1;
			break;
		default:
			goto done;
		}
	}
	/* SLUICE_MAX_EXT_HDRS walked: the next one must be the payload's. */
	switch (nexthdr) {
	case IPPROTO_HOPOPTS:
	case IPPROTO_ROUTING:
	case IPPROTO_DSTOPTS:
	case IPPROTO_AH:
	case IPPROTO_FRAGMENT:
		return PARSE_DROP;
	}
done:
	f->proto = nexthdr;
	f->l4_off = off;
	return PARSE_OK;
}

/* Fills f for TCP and UDP packets over IPv4/IPv6 behind an Ethernet header
 * (veth, physical NICs and lo all present one at TC). The frame's own
 * ethertype decides, not skb->protocol: an AF_PACKET sender sets that one
 * as it likes, while the receiving end takes the ethertype again
 * (eth_type_trans). A VLAN tag still in the frame at TC is a stacked one
 * (the kernel strips the outer tag before TC ingress and veth carries tags
 * out of band): the stack may strip it later and deliver what is inside. */
static __always_inline int parse_flow(struct __sk_buff *skb, struct flow *f)
{
	__u8 l4[20];
	__be16 ethertype;
	int ret;

	__builtin_memset(f, 0, sizeof(*f));
	if (load_hdr(skb, offsetof(struct ethhdr, h_proto), &ethertype, sizeof(ethertype)) < 0)
		return PARSE_OTHER;
	f->l3_off = sizeof(struct ethhdr);
	if (ethertype == bpf_htons(ETH_P_IP))
		ret = parse_ipv4(skb, f);
	else if (ethertype == bpf_htons(ETH_P_IPV6))
		ret = parse_ipv6(skb, f);
	else if (ethertype == bpf_htons(ETH_P_8021Q_) || ethertype == bpf_htons(ETH_P_8021AD_))
		return PARSE_DROP;
	else
		return PARSE_OTHER;
	if (ret != PARSE_OK)
		return ret;

	if (f->proto == IPPROTO_TCP) {
		if (f->frag)
			return PARSE_DROP; /* the kernel reassembles it after TC */
		/* The whole header, options included, must be there: the kernel
		 * drops a shorter one, and a checksum fix-up at offset 16 would
		 * fail half way through a rewrite. */
		if (load_hdr(skb, f->l4_off, l4, 20) < 0)
			return PARSE_DROP;
		if ((l4[12] >> 4) < 5 || f->l4_off + (l4[12] >> 4) * 4 > skb->len)
			return PARSE_DROP;
		f->tcp_flags = l4[13];
	} else if (f->proto == IPPROTO_UDP) {
		if (f->frag) {
			/* The ports, if this first fragment holds them. */
			if (load_hdr(skb, f->l4_off, l4, 4) < 0)
				return PARSE_DROP;
		} else if (load_hdr(skb, f->l4_off, l4, 8) < 0) {
			return PARSE_DROP;
		}
	} else {
		return PARSE_OTHER;
	}
	__builtin_memcpy(&f->sport, &l4[0], 2);
	__builtin_memcpy(&f->dport, &l4[2], 2);
	return f->frag ? PARSE_UDP_FRAGMENT : PARSE_OK;
}

static __always_inline int flow_is_syn(const struct flow *f)
{
	return (f->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST | TCP_FLAG_FIN)) ==
	       TCP_FLAG_SYN;
}

static __always_inline int addr_eq(const __u32 *a, const __u32 *b, __u8 family)
{
	if (family == AF_INET)
		return a[0] == b[0];
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline int addr_is_loopback(const __u32 *a, __u8 family)
{
	if (family == AF_INET)
		return (a[0] & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
	return a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == bpf_htonl(1);
}

/* Copies an address of the family; the rest of dst is left as it is. */
static __always_inline void addr_copy(void *dst, const void *src, __u8 family)
{
	if (family == AF_INET)
		__builtin_memcpy(dst, src, 4);
	else
		__builtin_memcpy(dst, src, 16);
}

static __always_inline void addr_set_loopback(__u32 *a, __u8 family)
{
	if (family == AF_INET) {
		a[0] = bpf_htonl(0x7f000001);
	} else {
		a[0] = 0;
		a[1] = 0;
		a[2] = 0;
		a[3] = bpf_htonl(1);
	}
}
