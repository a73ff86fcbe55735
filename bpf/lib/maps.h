/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map definitions shared by the pod programs. Layouts come from maps/. */
#pragma once

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "maps/sluice_maps.h"

/* Global settings: ports, marks, probe addresses (key 0). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_settings);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} settings SEC(".maps");

/* Per-pod settings, keyed by netns cookie. Absent: the netns is not enrolled. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_MAX_PODS);
	__type(key, __u64);
	__type(value, struct sluice_pod_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_config SEC(".maps");

/* Per-pod counters. Not preallocated: per-CPU values for every possible pod
 * would cost max_entries * ncpus * 64 bytes up front. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, SLUICE_MAX_PODS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct sluice_pod_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_stats SEC(".maps");

/* DNS translations recorded at capture, applied to answers. Bounded: LRU. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_DNS_NAT_ENTRIES);
	__type(key, struct sluice_dns_nat_key);
	__type(value, struct sluice_dns_nat_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dns_nat SEC(".maps");

/* pod_egress's decision per socket (enum sluice_verdict), freed with the
 * socket. Pinned so that upgraded programs keep the decisions; bpftool can
 * show it but not dump it (its keys are sockets). */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sluice_sock_verdict);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock_verdict SEC(".maps");

/* The proxy's wildcard-bound TCP listeners per pod, port and family
 * (struct sluice_listener_key), filled by the programs (lib/sock.h). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, SLUICE_LISTENER_ENTRIES);
	__type(key, struct sluice_listener_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_listeners SEC(".maps");

/* Registry of enrolled pods; written and read by user space only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_MAX_PODS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_pod_id);
	__type(value, struct sluice_pod_record);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pods SEC(".maps");

/* The node proxy's identity (maps/sluice_maps.h): whether a proxy-marked
 * packet must also come from one of the proxy's cgroups, and those. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_proxy_identity);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} proxy_identity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_PROXY_CGROUPS);
	__type(key, __u64);
	__type(value, struct sluice_proxy_cgroup);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} proxy_cgroups SEC(".maps");

/* Layout version of every pinned map (maps/sluice_maps.h, SLUICE_LAYOUT_*);
 * written and read by user space only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct sluice_layout_key);
	__type(value, struct sluice_layout_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} layouts SEC(".maps");

/* Node side: enrolled pods' addresses (Istio's probe ipset). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_POD_ADDR_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_pod_addr);
	__type(value, struct sluice_pod_addr_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_addrs SEC(".maps");

/* Node side: probe SNAT state, one element per connection, keyed by the
 * tuple of its replies (bpf/host_tc.bpf.c). Bounded: LRU, which evicts a
 * connection whole. (snat_fwd, the forward half of layout 1, is gone: the
 * loader migrates its flags and removes its pin.) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_SNAT_ENTRIES);
	__type(key, struct sluice_snat_key);
	__type(value, struct sluice_snat_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_rev SEC(".maps");

/*
 * Closed probe connections, moved here when snat_rev forgets them (same
 * key and value): late packets (the ACK of a FIN in a simultaneous
 * close, a FIN retransmitted after a lost last ACK) are still translated.
 * The role of conntrack's TIME_WAIT, bounded by count instead of time.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_SNAT_CLOSED_ENTRIES);
	__type(key, struct sluice_snat_key);
	__type(value, struct sluice_snat_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_closed SEC(".maps");

static __always_inline const struct sluice_settings *settings_get(void)
{
	__u32 zero = 0;
	const struct sluice_settings *s = bpf_map_lookup_elem(&settings, &zero);

	/* An all-zero entry means the loader has not written settings yet. */
	if (!s || !s->outbound_port)
		return 0;
	return s;
}

/* Rule 5: is a packet carrying the proxy mark really the proxy's? With the
 * proxy's identity known, only if its socket is in one of the proxy's
 * cgroups (bpf_skb_cgroup_id: the cgroup v2 of skb->sk's full socket). */
static __always_inline int proxy_marked_is_proxy(struct __sk_buff *skb)
{
	__u32 zero = 0;
	const struct sluice_proxy_identity *id = bpf_map_lookup_elem(&proxy_identity, &zero);
	__u64 cg;

	if (!id || !id->cgroup_check)
		return 1;
	cg = bpf_skb_cgroup_id(skb);
	return cg && bpf_map_lookup_elem(&proxy_cgroups, &cg) != 0;
}

#define SLUICE_COUNT(cookie, field)                                              \
	do {                                                                     \
		struct sluice_pod_stats *st_ = bpf_map_lookup_elem(&pod_stats, &(cookie)); \
		if (st_)                                                         \
			st_->field++;                                            \
	} while (0)
