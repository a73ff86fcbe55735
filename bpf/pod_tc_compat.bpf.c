// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The pod programs for kernels without the bpf_cast_to_kern_ctx kfunc
 * (Linux 6.1, 5.15): the same source, with the pod found through
 * bpf_probe_read_kernel (lib/pod.h). A separate object because libbpf must
 * resolve every kfunc an object names, loaded or not; the loader picks one
 * object from the feature probe (loader/features.h).
 */
#define SLUICE_POD_COOKIE_PROBE_READ 1
#include "pod_tc.bpf.c"
