// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The socket programs for kernels without the bpf_cast_to_kern_ctx kfunc
 * (Linux 6.1, 5.15): the same source, with the pod of a cgroup_skb packet
 * found through bpf_probe_read_kernel (lib/pod.h), as pod_tc_compat does.
 */
#define SLUICE_POD_COOKIE_PROBE_READ 1
#include "pod_sock.bpf.c"
