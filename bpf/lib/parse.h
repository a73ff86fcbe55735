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

enum parse_result {
	PARSE_OK = 0,
	PARSE_OTHER,     /* not IP, not TCP/UDP, or a fragment: not ours */
	PARSE_MALFORMED, /* truncated or inconsistent headers */
	PARSE_TOO_DEEP,  /* more IPv6 extension headers than we walk */
};

struct flow {
	__u32 saddr[4]; /* network byte order; IPv4 uses saddr[0] */
	__u32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;
	__u8 pad;
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
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (off <= 1024 && data + off + len <= end) {
		__builtin_memcpy(to, data + off, len);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, to, len);
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct flow *f)
{
	struct iphdr ip;

	if (load_hdr(skb, f->l3_off, &ip, sizeof(ip)) < 0)
		return PARSE_MALFORMED;
	if (ip.version != 4 || ip.ihl < 5)
		return PARSE_MALFORMED;
	/* Fragments are left to the kernel: TCP does not fragment (PMTU
	 * discovery) and a non-first fragment has no ports to classify. */
	if (ip.frag_off & bpf_htons(0x3fff))
		return PARSE_OTHER;
	f->family = AF_INET;
	f->proto = ip.protocol;
	f->saddr[0] = ip.saddr;
	f->daddr[0] = ip.daddr;
	f->l4_off = f->l3_off + ip.ihl * 4;
	return PARSE_OK;
}

static __always_inline int parse_ipv6(struct __sk_buff *skb, struct flow *f)
{
	struct ipv6hdr ip6;
	__u32 off = f->l3_off + sizeof(ip6);
	__u8 nexthdr;
	int i;

	if (load_hdr(skb, f->l3_off, &ip6, sizeof(ip6)) < 0)
		return PARSE_MALFORMED;
	if (ip6.version != 6)
		return PARSE_MALFORMED;
	__builtin_memcpy(f->saddr, &ip6.saddr, 16);
	__builtin_memcpy(f->daddr, &ip6.daddr, 16);
	nexthdr = ip6.nexthdr;

#pragma unroll
	for (i = 0; i < SLUICE_MAX_EXT_HDRS; i++) {
		__u8 hdr[2];

		switch (nexthdr) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			if (load_hdr(skb, off, hdr, 2) < 0)
				return PARSE_MALFORMED;
			nexthdr = hdr[0];
			off += (hdr[1] + 1) * 8;
			break;
		case IPPROTO_AH:
			if (load_hdr(skb, off, hdr, 2) < 0)
				return PARSE_MALFORMED;
			nexthdr = hdr[0];
			off += (hdr[1] + 2) * 4;
			break;
		case IPPROTO_FRAGMENT:
			/* See parse_ipv4: fragments are the kernel's. */
			return PARSE_OTHER;
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
		return PARSE_TOO_DEEP;
	case IPPROTO_FRAGMENT:
		return PARSE_OTHER;
	}
done:
	f->family = AF_INET6;
	f->proto = nexthdr;
	f->l4_off = off;
	return PARSE_OK;
}

/* Fills f for TCP and UDP packets over IPv4/IPv6 behind an Ethernet header
 * (veth, physical NICs and lo all present one at TC). */
static __always_inline int parse_flow(struct __sk_buff *skb, struct flow *f)
{
	__u8 l4[20];
	int ret;

	__builtin_memset(f, 0, sizeof(*f));
	f->l3_off = sizeof(struct ethhdr);
	if (skb->protocol == bpf_htons(ETH_P_IP))
		ret = parse_ipv4(skb, f);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		ret = parse_ipv6(skb, f);
	else
		return PARSE_OTHER;
	if (ret != PARSE_OK)
		return ret;

	if (f->proto == IPPROTO_TCP) {
		/* The whole header, options included, must be there: the kernel
		 * drops a shorter one, and a checksum fix-up at offset 16 would
		 * fail half way through a rewrite. */
		if (load_hdr(skb, f->l4_off, l4, 20) < 0)
			return PARSE_MALFORMED;
		if ((l4[12] >> 4) < 5 || f->l4_off + (l4[12] >> 4) * 4 > skb->len)
			return PARSE_MALFORMED;
		f->tcp_flags = l4[13];
	} else if (f->proto == IPPROTO_UDP) {
		if (load_hdr(skb, f->l4_off, l4, 8) < 0)
			return PARSE_MALFORMED;
	} else {
		return PARSE_OTHER;
	}
	__builtin_memcpy(&f->sport, &l4[0], 2);
	__builtin_memcpy(&f->dport, &l4[2], 2);
	return PARSE_OK;
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
