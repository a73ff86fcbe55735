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
 * connection whole. (snat_fwd, the forward half of earlier builds, is gone:
 * the loader removes its pin.) */
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

#define SLUICE_COUNT(cookie, field)                                              \
	do {                                                                     \
		struct sluice_pod_stats *st_ = bpf_map_lookup_elem(&pod_stats, &(cookie)); \
		if (st_)                                                         \
			st_->field++;                                            \
	} while (0)
