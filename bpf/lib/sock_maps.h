/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps of the socket mode (bpf/pod_sock.bpf.c). Layouts come from maps/. */
#pragma once

#include "maps.h"

/* Per-pod settings of the socket mode, keyed by netns cookie. Absent: the
 * socket programs leave the netns alone. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_MAX_PODS);
	__type(key, __u64);
	__type(value, struct sluice_pod_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pod_sock SEC(".maps");

/* A captured socket's original destination, freed with the socket: the
 * app's socket (getpeername, DNS answers) and the proxy's accepted socket
 * (its SO_ORIGINAL_DST, once asked). */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sluice_sock_orig);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock_orig SEC(".maps");

/* Outbound connections between their connect() and the proxy's
 * SO_ORIGINAL_DST, keyed by the app's address and port. Bounded: LRU (an
 * entry leaves when the proxy asked). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_ORIG_DST_ENTRIES);
	__type(key, struct sluice_orig_key);
	__type(value, struct sluice_sock_orig);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} orig_dst SEC(".maps");

/* The proxy's listeners per pod, port, socket family and slot, put here by
 * pod_sockops when the proxy listens; a closed socket leaves by itself. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, SLUICE_LISTENER_ENTRIES);
	__type(key, struct sluice_sock_listener_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock_listeners SEC(".maps");

/* The proxy's connections to its pod's apps from a foreign source (rule 4),
 * which pod_sk_lookup must leave alone. Bounded: LRU. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_PROXY_CONN_ENTRIES);
	__type(key, struct sluice_conn_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} proxy_conns SEC(".maps");

/* The pod the running sk_lookup program serves (maps/sluice_maps.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_lookup_pod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sk_lookup_pod SEC(".maps");

/* Slot 0: the shared sk_lookup program, tail-called by each pod's own. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sk_lookup_prog SEC(".maps");
