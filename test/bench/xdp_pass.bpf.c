// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sluice-bench's "+xdp" cases (issue 16, item 5): the least an XDP program
 * can be, attached in native (driver) mode to both ends of the pod's veth,
 * to measure what XDP on a veth costs or gains each workload before any
 * work is put in it. Not part of the product.
 *
 * Attaching any XDP program to a veth switches its receive side to NAPI
 * (frames from the peer go through a ptr_ring and a NAPI poll instead of
 * the backlog) and clears TSO on the PEER (the driver drops the software
 * GSO features of a device whose peer runs XDP), so TCP leaves
 * each end segmented at the MSS by software GSO; GRO stays off here (Linux
 * 6.18: ethtool -k shows it off on both ends before and after). Both ends
 * carry a program, so both directions pay. Two variants, because the veth
 * driver treats them differently on receive:
 *
 *   xdp_pass        cannot handle multi-buffer frames: a non-linear skb is
 *                   copied into one page before the run, and the peer's
 *                   MTU is capped at about a page.
 *   xdp_pass_frags  the same, loaded with BPF_F_XDP_HAS_FRAGS ("xdp.frags"):
 *                   multi-buffer frames are passed as they are. It does not
 *                   keep the peer's TSO (measured: TSO off either way).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("xdp.frags")
int xdp_pass_frags(struct xdp_md *ctx)
{
	return XDP_PASS;
}
