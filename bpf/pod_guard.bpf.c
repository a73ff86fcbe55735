// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The pod guard: BPF LSM programs (Linux 5.7+, with "bpf" among the
 * kernel's active LSMs, /sys/kernel/security/lsm) that refuse an enrolled
 * pod's apps what no hook of either capture mode can judge afterwards:
 *
 *  - packet sockets (AF_PACKET) and XDP sockets (AF_XDP). Their frames
 *    pass no cgroup hook (the socket mode sees none of them) and, sent with
 *    PACKET_QDISC_BYPASS or by AF_XDP's direct transmit, no TC hook either
 *    (the TC mode's pod_egress never runs): a user-space TCP stack on one
 *    reaches any host around the proxy. Refused at socket().
 *  - binding the proxy's ports (outbound, inbound, HBONE, DNS) in the pod.
 *    Any socket of the proxy's uid may join its reuseport group and get a
 *    share of the connections handed to it (the TC mode assigns the group,
 *    whose member the kernel picks), and a listener bound before the
 *    proxy's would take them all. Refused at bind().
 *
 * "An app" is a task in the pod's network namespace without CAP_NET_ADMIN
 * (CAP_NET_RAW alone is what containerd and Docker grant by default). A
 * task holding CAP_NET_ADMIN owns the pod's network in any case -- it can
 * flush the policy routes and detach programs -- and the node proxy holds
 * it (ztunnel runs with NET_ADMIN, SYS_ADMIN and NET_RAW), so the guard
 * needs no proxy identity and holds with the mark alone. Pods are those of
 * either mode: pod_sock (socket) or pod_config (TC), by netns cookie.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

#include "lib/sock_maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SLUICE_AF_INET 2
#define SLUICE_AF_INET6 10
#define SLUICE_AF_PACKET 17
#define SLUICE_AF_XDP 44
#define SLUICE_EPERM 1
#define SLUICE_CAP_NET_ADMIN 12

/* The kernel's structures, as far as read here (CO-RE; the ___guard
 * flavour is dropped when matched against the kernel's BTF). The layout
 * of kernel_cap_t changed in 6.3 (u32[2] -> u64); only the offset of
 * cap_effective is relocated, and its first 32 bits are read: the same
 * capabilities 0-31 in both layouts (little-endian). */
struct net___guard {
	__u64 net_cookie;
} __attribute__((preserve_access_index));
struct nsproxy___guard {
	struct net___guard *net_ns;
} __attribute__((preserve_access_index));
struct cred___guard {
	struct {
		__u32 lo;
	} cap_effective;
} __attribute__((preserve_access_index));
struct task_struct___guard {
	struct nsproxy___guard *nsproxy;
	const struct cred___guard *cred;
} __attribute__((preserve_access_index));

/* The netns cookie of the calling task, if its netns is an enrolled pod's;
 * 0 otherwise. */
static __always_inline __u64 current_pod(void)
{
	struct task_struct___guard *t = (void *)bpf_get_current_task();
	__u64 cookie = BPF_CORE_READ(t, nsproxy, net_ns, net_cookie);

	if (!cookie)
		return 0;
	if (bpf_map_lookup_elem(&pod_sock, &cookie) || bpf_map_lookup_elem(&pod_config, &cookie))
		return cookie;
	return 0;
}

static __always_inline int current_has_net_admin(void)
{
	struct task_struct___guard *t = (void *)bpf_get_current_task();
	const struct cred___guard *cred = BPF_CORE_READ(t, cred);
	__u32 caps = 0;

	if (!cred)
		return 0;
	bpf_probe_read_kernel(&caps, sizeof(caps), (const void *)cred + bpf_core_field_offset(struct cred___guard, cap_effective));
	return (caps >> SLUICE_CAP_NET_ADMIN) & 1;
}

SEC("lsm/socket_create")
int BPF_PROG(guard_socket_create, int family, int type, int protocol, int kern, int ret)
{
	if (ret || kern)
		return ret;
	if (family != SLUICE_AF_PACKET && family != SLUICE_AF_XDP)
		return 0;
	if (!current_pod() || current_has_net_admin())
		return 0;
	return -SLUICE_EPERM;
}

SEC("lsm/socket_bind")
int BPF_PROG(guard_socket_bind, void *sock, void *address, int addrlen, int ret)
{
	const struct sluice_settings *cfg;
	__u16 hdr[2]; /* family, port (network order): the same place in sockaddr_in and sockaddr_in6 */
	__u16 port;

	if (ret)
		return ret;
	if (addrlen < 4 || bpf_probe_read_kernel(hdr, sizeof(hdr), address) < 0)
		return 0;
	if (hdr[0] != SLUICE_AF_INET && hdr[0] != SLUICE_AF_INET6)
		return 0;
	cfg = settings_get();
	if (!cfg)
		return 0;
	port = bpf_ntohs(hdr[1]);
	if (port != cfg->outbound_port && port != cfg->inbound_port && port != cfg->hbone_port && port != cfg->dns_port)
		return 0;
	if (!current_pod() || current_has_net_admin())
		return 0;
	return -SLUICE_EPERM;
}
