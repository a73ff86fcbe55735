// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sluice-bench's "tc-minimal" case: the least a redirect at TC hooks must do
 * on the benchmark's topology, as a yardstick for what the mechanism itself
 * costs on this machine. Not a usable redirect: no pods, no rules, no
 * decisions, IPv4 TCP only, and fixed address ranges.
 *
 *   eth0 egress:  TCP to out_net:out_port -> return mark, looped to ingress
 *   eth0 ingress: looped SYN -> bpf_sk_assign(outbound listener)
 *                 SYN to in_net:in_port  -> bpf_sk_assign(inbound listener)
 *
 * The listeners come from a SOCKMAP (one lookup, no socket-table search).
 * Everything around the programs (tcx links, the return mark's policy
 * route, sysctls) is sluice's own: the case enrolls the pod with sluice and
 * swaps these programs into its links.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set before load; addresses and ports in network byte order. */
const volatile __u32 out_net = 0; /* a /24 */
const volatile __u16 out_port = 0;
const volatile __u32 in_net = 0; /* a /24 */
const volatile __u16 in_port = 0;
const volatile __u32 return_mark = 0;

#define MINIMAL_OUTBOUND 0
#define MINIMAL_INBOUND 1

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} listeners SEC(".maps");

static __always_inline struct tcphdr *tcp_v4(struct __sk_buff *skb, struct iphdr **iph)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip + 1);

	if ((void *)(th + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 ||
	    ip->protocol != IPPROTO_TCP)
		return 0;
	*iph = ip;
	return th;
}

static __always_inline int in_net24(__u32 addr, __u32 net)
{
	return (addr & bpf_htonl(0xffffff00)) == net;
}

static __always_inline int assign(struct __sk_buff *skb, __u32 which)
{
	struct bpf_sock *sk = bpf_map_lookup_elem(&listeners, &which);
	long err;

	if (!sk)
		return TC_ACT_SHOT;
	err = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	return err ? TC_ACT_SHOT : TC_ACT_OK;
}

SEC("tc")
int minimal_egress(struct __sk_buff *skb)
{
	struct iphdr *ip;
	struct tcphdr *th = tcp_v4(skb, &ip);

	if (!th || !in_net24(ip->daddr, out_net) || th->dest != out_port)
		return TC_ACT_OK;
	skb->mark = return_mark;
	return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
}

SEC("tc")
int minimal_ingress(struct __sk_buff *skb)
{
	struct iphdr *ip;
	struct tcphdr *th;

	/* Looped by minimal_egress (a packet from outside the netns arrives
	 * with its mark cleared): delivered locally by the return mark's
	 * route; only the SYN needs the listener. */
	if (skb->mark == return_mark) {
		bpf_skb_change_type(skb, PACKET_HOST);
		th = tcp_v4(skb, &ip);
		if (th && th->syn && !th->ack)
			return assign(skb, MINIMAL_OUTBOUND);
		return TC_ACT_OK;
	}
	th = tcp_v4(skb, &ip);
	if (!th || !th->syn || th->ack || !in_net24(ip->daddr, in_net) || th->dest != in_port)
		return TC_ACT_OK;
	return assign(skb, MINIMAL_INBOUND);
}
