/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Which pod a packet belongs to: the cookie of the network namespace of the
 * device it passes. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/*
 * bpf_get_netns_cookie(skb) at TC answers with the netns of skb->sk and
 * falls back to init_net: a packet arriving from outside the pod has no
 * socket, so it would not find its pod. The device's netns is what we want:
 * read it through the kernel's sk_buff (bpf_cast_to_kern_ctx, Linux 6.3).
 * Local CO-RE definitions (the ___sluice flavour is ignored by libbpf when
 * it matches them against the kernel's BTF) keep vmlinux.h out of the tree.
 */
struct net___sluice {
	__u64 net_cookie;
} __attribute__((preserve_access_index));

struct net_device___sluice {
	struct {
		struct net___sluice *net;
	} nd_net;
} __attribute__((preserve_access_index));

struct sk_buff___sluice {
	struct net_device___sluice *dev;
} __attribute__((preserve_access_index));

#ifdef SLUICE_POD_COOKIE_PROBE_READ
#include <bpf/bpf_core_read.h>

/*
 * Kernels without bpf_cast_to_kern_ctx (before 6.2; built from
 * pod_tc_compat.bpf.c, chosen by the loader). The __sk_buff pointer of a TC
 * program is the kernel's sk_buff, so bpf_probe_read_kernel can follow it.
 * The verifier lets a context pointer be the helper's source argument
 * (ARG_ANYTHING) only when pointer leaks are allowed: the loader runs as
 * root (CAP_PERFMON). A NULL dev reads as 0: the helper zeroes its
 * destination on a fault.
 */
static __always_inline __u64 pod_cookie(struct __sk_buff *skb)
{
	struct sk_buff___sluice *k = (void *)skb;

	return BPF_CORE_READ(k, dev, nd_net.net, net_cookie);
}
#else
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

static __always_inline __u64 pod_cookie(struct __sk_buff *skb)
{
	struct sk_buff___sluice *k = bpf_cast_to_kern_ctx(skb);
	struct net_device___sluice *dev = k->dev;

	if (!dev)
		return 0;
	return dev->nd_net.net->net_cookie;
}
#endif
