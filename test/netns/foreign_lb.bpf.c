// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * A foreign connect-time load balancer for the neighbour tests
 * (connect_lb_test.cpp): what Cilium's socket LB and Calico's connect-time
 * load balancing do at the cgroup connect4/6 hooks. A connect() to the
 * service address and port is sent to the backend instead; anything else
 * is left alone. The test sets the addresses (network byte order) before
 * loading; `translated` counts the connects it rewrote.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile __u32 service_v4 = 0, backend_v4 = 0;
const volatile __u32 service_v6[4] = {}, backend_v6[4] = {};
const volatile __u32 service_port = 0, backend_port = 0; /* as user_port: network order */

__u64 translated = 0;

SEC("cgroup/connect4")
int lb_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->user_ip4 != service_v4 || ctx->user_port != service_port)
		return 1;
	ctx->user_ip4 = backend_v4;
	ctx->user_port = backend_port;
	__sync_fetch_and_add(&translated, 1);
	return 1;
}

SEC("cgroup/connect6")
int lb_connect6(struct bpf_sock_addr *ctx)
{
	if (ctx->user_ip6[0] != service_v6[0] || ctx->user_ip6[1] != service_v6[1] ||
	    ctx->user_ip6[2] != service_v6[2] || ctx->user_ip6[3] != service_v6[3] || ctx->user_port != service_port)
		return 1;
	ctx->user_ip6[0] = backend_v6[0];
	ctx->user_ip6[1] = backend_v6[1];
	ctx->user_ip6[2] = backend_v6[2];
	ctx->user_ip6[3] = backend_v6[3];
	ctx->user_port = backend_port;
	__sync_fetch_and_add(&translated, 1);
	return 1;
}
