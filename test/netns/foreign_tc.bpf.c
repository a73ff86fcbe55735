// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * A foreign TC program for the good-neighbour tests (neighbours_test.cpp):
 * what a CNI's or an observability tool's program would be on the same
 * hooks as sluice's. It counts the packets it sees by protocol and ports
 * and returns the verdict the test set before loading: 0 (TC_ACT_OK /
 * TCX_PASS: ends the chain, as a CNI that passes) or -1 (TCX_NEXT /
 * TC_ACT_UNSPEC: hands on).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct foreign_key {
	__u8 proto;
	__u8 pad;
	__be16 sport;
	__be16 dport;
	__u16 pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct foreign_key);
	__type(value, __u64);
} seen SEC(".maps");

const volatile int verdict = -1;

SEC("tc")
int foreign(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct foreign_key k = {};
	__u64 one = 1, *n;
	__u8 *l4;

	if ((void *)(eth + 1) > end)
		return verdict;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end)
			return verdict;
		k.proto = ip->protocol;
		l4 = (__u8 *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return verdict;
		k.proto = ip6->nexthdr;
		l4 = (__u8 *)(ip6 + 1);
	} else {
		return verdict;
	}
	if ((k.proto == IPPROTO_TCP || k.proto == IPPROTO_UDP) && (void *)(l4 + 4) <= end) {
		__builtin_memcpy(&k.sport, l4, 2);
		__builtin_memcpy(&k.dport, l4 + 2, 2);
	}
	n = bpf_map_lookup_elem(&seen, &k);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&seen, &k, &one, BPF_NOEXIST);
	return verdict;
}
