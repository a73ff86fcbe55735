// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The node's probe source (spec rules 10 and 11), the counterpart of
 * Istio's
 *   -t nat POSTROUTING -m owner --socket-exists -p tcp
 *      -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127
 * chosen at connect() instead of translated on the wire: cgroup
 * connect4/connect6 programs attached once per node (at the cgroup v2 root,
 * loader/probe_hook.h). A TCP socket of the node's netns that connects to an
 * enrolled pod's address (pod_addrs) is bound to the probe address with
 * port 0, so the kernel picks its port when it connects (unique for the
 * 4-tuple: two probers never collide) and the connection is an ordinary
 * one of the node's, from 169.254.7.127 (v6 fd16:9254:7127:1337:ffff:ffff:
 * ffff:ffff), which the node owns (loader/probe_hook.h puts it on lo).
 * Nothing is translated, so nothing is kept per connection.
 *
 *   prober (node netns) connect(pod:8080) -> node_connect4: bind(169.254.7.127:0)
 *   -> SYN 169.254.7.127:P -> pod:8080 ... pod's reply to 169.254.7.127:P -> prober
 *
 * Only sockets connect()ed in the node's netns (the netns recorded with
 * the pod's addresses): forwarded traffic has no socket on the node and
 * passes no cgroup hook (rule 11); a hostNetwork pod's sockets are the
 * node's. A socket its app bound already keeps its address (counted in
 * probe_stats; Istio's SNAT rule would rewrite it): such a connection
 * reaches the pod from the node's address and is captured by its proxy,
 * like forwarded traffic, never let past it.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>

#include "lib/maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SLUICE_SOCK_STREAM 1
#ifndef AF_INET
#define AF_INET 2
#define AF_INET6 10
#endif

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_PROBE_STATS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} probe_stats SEC(".maps");

static __always_inline void probe_count(__u32 what)
{
	__u64 *n = bpf_map_lookup_elem(&probe_stats, &what);

	if (n)
		(*n)++;
}

static __always_inline int probe_connect(struct bpf_sock_addr *ctx, const int v6)
{
	struct bpf_sock *sk = ctx->sk;
	const struct sluice_settings *cfg;
	struct sluice_pod_addr pa = {};
	struct sluice_pod_addr_info *pod;
	__u32 a[4] = {};

	if (!sk || ctx->type != SLUICE_SOCK_STREAM || ctx->protocol != IPPROTO_TCP)
		return 1;
	if (v6) {
		a[0] = ctx->user_ip6[0];
		a[1] = ctx->user_ip6[1];
		a[2] = ctx->user_ip6[2];
		a[3] = ctx->user_ip6[3];
	} else {
		a[0] = ctx->user_ip4;
	}
	__builtin_memcpy(pa.addr, a, sizeof(a));
	pa.family = v6 ? AF_INET6 : AF_INET;
	pod = bpf_map_lookup_elem(&pod_addrs, &pa);
	if (!pod || bpf_get_netns_cookie(ctx) != pod->node_netns_cookie)
		return 1;
	cfg = settings_get();
	if (!cfg)
		return 1;
	/* Bound by its app (an address, or a port: bind() before connect()). */
	if (sk->src_port || (v6 ? (sk->src_ip6[0] | sk->src_ip6[1] | sk->src_ip6[2] | sk->src_ip6[3]) : sk->src_ip4)) {
		probe_count(SLUICE_PROBE_STAT_APP_BOUND);
		return 1;
	}
	if (v6) {
		struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6 };

		__builtin_memcpy(&sin6.sin6_addr, cfg->probe_v6, 16);
		if (bpf_bind(ctx, (struct sockaddr *)&sin6, sizeof(sin6)) != 0)
			goto failed;
	} else {
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = cfg->probe_v4 };

		if (bpf_bind(ctx, (struct sockaddr *)&sin, sizeof(sin)) != 0)
			goto failed;
	}
	probe_count(SLUICE_PROBE_STAT_BOUND);
	SLUICE_COUNT(pod->netns_cookie, probe_conns);
	return 1;
failed:
	probe_count(SLUICE_PROBE_STAT_BIND_FAILED);
	return 1;
}

SEC("cgroup/connect4")
int node_connect4(struct bpf_sock_addr *ctx)
{
	return probe_connect(ctx, 0);
}

SEC("cgroup/connect6")
int node_connect6(struct bpf_sock_addr *ctx)
{
	return probe_connect(ctx, 1);
}
