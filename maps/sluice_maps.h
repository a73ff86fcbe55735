/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The single definition of everything the BPF programs and the C++ side both
 * read: constants, map key/value layouts, capacities and pin names.
 *
 * Plain C with fixed-width types so it compiles for `clang -target bpf` and
 * for g++. Every struct has explicit padding and a size assertion: a layout
 * change that is not made on purpose fails the build on both sides.
 */
#ifndef SLUICE_MAPS_H
#define SLUICE_MAPS_H

#include <linux/types.h>

#ifdef __cplusplus
#define SLUICE_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define SLUICE_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* ---- Defaults: the same names and values as Istio's ambient mode. ---- */
#define SLUICE_DEFAULT_OUTBOUND_PORT 15001
#define SLUICE_DEFAULT_INBOUND_PORT 15006
#define SLUICE_DEFAULT_HBONE_PORT 15008
#define SLUICE_DEFAULT_DNS_PORT 15053
#define SLUICE_DEFAULT_PROXY_MARK 0x539
#define SLUICE_DEFAULT_RETURN_MARK 0x111
#define SLUICE_DEFAULT_MARK_MASK 0xfff
#define SLUICE_ROUTE_TABLE 100
#define SLUICE_RULE_PRIORITY 32764
/* 169.254.7.127 in network byte order is built at run time from this. */
#define SLUICE_DEFAULT_PROBE_V4 "169.254.7.127"
#define SLUICE_DEFAULT_PROBE_V6 "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"

/*
 * The socket mode sends a captured connection to the proxy's outbound
 * listener over loopback, at an address and port chosen by its original
 * destination, so that each destination keeps a port space of its own (the
 * kernel picks an app's ephemeral port per destination, as without a mesh):
 * IPv4 at 127.1.x.y:15001 (127.1.0.0/16), IPv6 at [::1]:P, P in the block
 * below (IPv6 has one loopback address), which the pod's sk_lookup program
 * hands to the outbound listener. Both stay loopback, where the kernel may
 * reuse a closed connection's port after a second (tcp_tw_reuse = 2).
 */
#define SLUICE_PROXY_LO_NET 0x7f010000u   /* 127.1.0.0/16, host byte order */
#define SLUICE_PROXY_LO6_PORT_BASE 16384u  /* [::1]:16384 .. [::1]:32767 */
#define SLUICE_PROXY_LO6_PORT_BITS 14

/*
 * Egress hands a captured packet to the ingress hook of the same interface
 * (bpf_redirect with BPF_F_INGRESS; bpf_sk_assign only works at ingress).
 * The mark carries the decision across: within one netns bpf_redirect keeps
 * skb->mark (kernel >= 5.14), and packets that really arrive from another
 * namespace have it cleared, so a real inbound packet can never carry it.
 * The tag lives above the 0xfff bits that Istio's marks use.
 */
#define SLUICE_TAG_MASK 0xffff0000u
#define SLUICE_TAG_MAGIC 0x51ce0000u
enum sluice_tag {
	SLUICE_TAG_OUTBOUND = 1, /* new TCP connection for the outbound listener */
	SLUICE_TAG_DNS_TCP = 2,  /* new TCP connection for the DNS listener */
	SLUICE_TAG_DNS_UDP = 3,  /* UDP query for the DNS listener */
	SLUICE_TAG_OWNED = 4,    /* packet of a flow a local proxy socket owns */
	SLUICE_TAG_OWNED_DATA = 5, /* the same, TCP without SYN: no parsing needed */
};

/*
 * What pod_egress decided for a TCP socket of the pod, remembered in the
 * socket's BPF local storage (map sock_verdict): later packets of the
 * socket skip the socket-table lookup. The decision is a property of the
 * connection's addresses, which a connected socket never changes.
 */
enum sluice_verdict {
	SLUICE_VERDICT_NONE = 0,
	SLUICE_VERDICT_PASS = 1,  /* no proxy socket owns the flow */
	SLUICE_VERDICT_OWNED = 2, /* the flow goes to a proxy socket */
};
struct sluice_sock_verdict {
	__u32 verdict; /* enum sluice_verdict */
};

/*
 * The proxy's TCP listeners, found once per pod, port and family with a
 * socket-table search and then taken from the SOCKHASH `pod_listeners`
 * (one hash lookup per new connection instead of the kernel's established
 * and listener searches). Only listeners bound to the wildcard address are
 * kept: for them the search's answer does not depend on the destination
 * (unless a listener bound to a specific address shares the port; the
 * proxy's contract has none, docs/redirection.md).
 * A listener leaves the map when it is closed; pod removal deletes the
 * pod's keys. The value is the socket (bpftool shows its cookie).
 */
struct sluice_listener_key {
	__u64 netns_cookie;
	__u16 port;  /* host byte order */
	__u8 family; /* of the packets it serves: AF_INET / AF_INET6 */
	__u8 pad[5];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_listener_key) == 16, "sluice_listener_key layout");

/*
 * The node proxy's identity beyond its mark (rule 5). Since Linux 5.17
 * SO_MARK needs only CAP_NET_RAW, which runtimes grant to containers, so any
 * app could set 0x539 and leave the mesh. The agent knows the node proxy's
 * processes (the peers of its ZDS connections) and so their cgroups: once
 * `proxy_identity` says so, a marked packet is the proxy's only when its
 * socket belongs to one of the cgroups (v2 ids) in `proxy_cgroups`. Off (the
 * entry zero): the mark alone decides, as in Istio.
 */
struct sluice_proxy_identity {
	__u32 cgroup_check; /* 1: the mark counts only from proxy_cgroups */
	__u32 pad;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_proxy_identity) == 8, "sluice_proxy_identity layout");

struct sluice_proxy_cgroup {
	__u32 pid;    /* the node proxy process seen in it (ZDS peer) */
	__u32 pad;
	__u64 since_ns; /* CLOCK_REALTIME when it was first seen */
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_proxy_cgroup) == 16, "sluice_proxy_cgroup layout");
#define SLUICE_PROXY_CGROUPS 16

/* Pod flags (struct sluice_pod_config.flags). */
#define SLUICE_POD_DNS_CAPTURE (1u << 0)
#define SLUICE_POD_INBOUND_CAPTURE (1u << 1)

#define SLUICE_MAX_REROUTE_IFACES 8
#define SLUICE_MAX_POD_IFACES 8
#define SLUICE_ID_LEN 64
#define SLUICE_NETNS_PATH_LEN 192
#define SLUICE_IFNAME_LEN 16

/* Capacities. */
#define SLUICE_MAX_PODS 16384
#define SLUICE_DNS_NAT_ENTRIES 65536
#define SLUICE_LISTENER_ENTRIES (SLUICE_MAX_PODS * 4) /* outbound + inbound, v4 + v6 */
#define SLUICE_MAX_POD_ADDRS 8
#define SLUICE_POD_ADDR_ENTRIES (SLUICE_MAX_PODS * 4)
#define SLUICE_SNAT_ENTRIES 65536
/* Recently closed probe connections, kept for their late packets. */
#define SLUICE_SNAT_CLOSED_ENTRIES 8192
/* Ports tried for a probe connection whose source port is taken. */
#define SLUICE_SNAT_PORT_TRIES 16

/* Pin names, relative to the bpffs root (default /sys/fs/bpf/sluice). */
#define SLUICE_DEFAULT_BPFFS_ROOT "/sys/fs/bpf/sluice"
#define SLUICE_PIN_SETTINGS "settings"
#define SLUICE_PIN_POD_CONFIG "pod_config"
#define SLUICE_PIN_POD_STATS "pod_stats"
#define SLUICE_PIN_DNS_NAT "dns_nat"
#define SLUICE_PIN_PODS "pods"
#define SLUICE_PIN_POD_ADDRS "pod_addrs"
#define SLUICE_PIN_PROBE_STATS "probe_stats"
/* Pins of earlier builds that a load removes once it has migrated them
 * (loader/migrate.cpp). snat_fwd: the forward half of probe SNAT state,
 * until snat_rev layout 2 kept one element per connection. */
#define SLUICE_PIN_RETIRED_SNAT_FWD "snat_fwd"
#define SLUICE_PIN_SNAT_REV "snat_rev"
#define SLUICE_PIN_SNAT_CLOSED "snat_closed"
#define SLUICE_PIN_POD_LISTENERS "pod_listeners"
#define SLUICE_PIN_LINKS_DIR "links" /* links/<pod id>/<ifname>_<hook> */
#define SLUICE_PIN_PROGRAMS_DIR "programs" /* programs/<build identity>/, programs/current (loader/program_pins.h) */
#define SLUICE_PIN_LAYOUTS "layouts"
#define SLUICE_PIN_PROXY_IDENTITY "proxy_identity"
#define SLUICE_PIN_PROXY_CGROUPS "proxy_cgroups"
#define SLUICE_PIN_POD_SOCK "pod_sock"
#define SLUICE_PIN_SOCK_ORIG "sock_orig"
#define SLUICE_PIN_ORIG_DST "orig_dst"
#define SLUICE_PIN_SOCK_LISTENERS "sock_listeners"
#define SLUICE_PIN_SK_LOOKUP_POD "sk_lookup_pod"
#define SLUICE_PIN_SK_LOOKUP_PROG "sk_lookup_prog"
#define SLUICE_PIN_PROXY_CONNS "proxy_conns"
/* The socket mode's node-wide cgroup links: node_links/<hook>. */
#define SLUICE_PIN_NODE_LINKS_DIR "node_links"

/*
 * Layout versions of the pinned maps. `layouts` (pinned hash: map name ->
 * version) records the version of every map pinned under a root, so that a
 * build with other layouts can tell: it migrates an older layout
 * (loader/migrate.cpp) and refuses a layout it cannot read in one line,
 * leaving the running data plane alone. State pinned by v0.1.0 has no
 * `layouts`: all its maps are version 1. Bump a map's version with any change
 * of its key, value, type, flags or capacity, and add the migration from the
 * version before.
 */
#define SLUICE_LAYOUT_SETTINGS 1
#define SLUICE_LAYOUT_POD_CONFIG 1
#define SLUICE_LAYOUT_POD_STATS 1
#define SLUICE_LAYOUT_DNS_NAT 1
#define SLUICE_LAYOUT_SOCK_VERDICT 1
#define SLUICE_LAYOUT_POD_LISTENERS 1
#define SLUICE_LAYOUT_PODS 3 /* 2: identity and hand-off state; 3: capture mode */
#define SLUICE_LAYOUT_POD_ADDRS 2 /* 2: the node netns cookie */
#define SLUICE_LAYOUT_SNAT_REV 2 /* 2: one element per connection, with its FIN
				  * flags (they were in snat_fwd, now retired) */
#define SLUICE_LAYOUT_SNAT_CLOSED 1
#define SLUICE_LAYOUT_LAYOUTS 1
#define SLUICE_LAYOUT_PROXY_IDENTITY 1
#define SLUICE_LAYOUT_PROXY_CGROUPS 1
#define SLUICE_LAYOUT_POD_SOCK 1
#define SLUICE_LAYOUT_SOCK_ORIG 1
#define SLUICE_LAYOUT_ORIG_DST 1
#define SLUICE_LAYOUT_SOCK_LISTENERS 1
#define SLUICE_LAYOUT_SK_LOOKUP_POD 1
#define SLUICE_LAYOUT_SK_LOOKUP_PROG 1
#define SLUICE_LAYOUT_PROXY_CONNS 1

struct sluice_layout_key {
	char name[16]; /* the map's name (= its pin name), NUL-padded */
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_layout_key) == 16, "sluice_layout_key layout");

struct sluice_layout_value {
	__u32 version;
	__u32 pad;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_layout_value) == 8, "sluice_layout_value layout");

/*
 * Global settings, one entry (key 0) of the `settings` array map.
 * Ports are in host byte order; addresses in network byte order.
 */
struct sluice_settings {
	__u16 outbound_port;
	__u16 inbound_port;
	__u16 hbone_port;
	__u16 dns_port;
	__u32 proxy_mark;
	__u32 return_mark;
	__u32 mark_mask;
	__u32 probe_v4; /* __be32 */
	__u8 probe_v6[16];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_settings) == 40, "sluice_settings layout");

/*
 * Per-pod settings, keyed by the pod's network namespace cookie
 * (SO_NETNS_COOKIE in user space, bpf_get_netns_cookie() in BPF): the
 * programs are shared by all pods and the cookie tells them apart.
 */
struct sluice_pod_config {
	__u32 flags; /* SLUICE_POD_* */
	__u32 reroute_count;
	__u32 reroute_ifindex[SLUICE_MAX_REROUTE_IFACES];
	char id[SLUICE_ID_LEN];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_config) == 104, "sluice_pod_config layout");

/* Per-pod counters (per-CPU hash, keyed by netns cookie). */
struct sluice_pod_stats {
	__u64 outbound_conns;  /* SYNs handed to the outbound listener */
	__u64 inbound_conns;   /* SYNs handed to the inbound listener */
	__u64 dns_tcp_conns;   /* SYNs handed to the DNS listener */
	__u64 dns_udp_queries; /* datagrams handed to the DNS listener */
	__u64 dns_answers;     /* answers given the resolver's address back */
	__u64 owned_pkts;      /* later packets handed to a proxy-owned socket */
	__u64 reserved;        /* was passed_pkts, never counted (cost): kept so the
				* layout of pinned maps stays; not shown anywhere */
	__u64 dropped_pkts;    /* fail closed: no proxy socket to hand to, or a
				* packet that cannot be judged (see README) */
	__u64 probe_conns;     /* node-side: probe connections given the probe source */
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_stats) == 72, "sluice_pod_stats layout");

/*
 * DNS translation, recorded when a query is captured and applied to the
 * answer: the app's connected socket accepts only the resolver's address.
 * Keyed by the querying socket (address, port, protocol) in its netns.
 */
struct sluice_dns_nat_key {
	__u64 netns_cookie;
	__u8 client_addr[16]; /* v4 uses the first 4 bytes */
	__be16 client_port;
	__u8 family; /* AF_INET / AF_INET6 */
	__u8 proto;  /* IPPROTO_TCP / IPPROTO_UDP */
	__u32 pad;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_dns_nat_key) == 32, "sluice_dns_nat_key layout");

struct sluice_dns_nat_value {
	__u8 resolver_addr[16];
	__be16 resolver_port;
	__u16 pad1;
	__u32 pad2;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_dns_nat_value) == 24, "sluice_dns_nat_value layout");

/*
 * Node side (spec rules 10, 11). The enrolled pods' addresses, the ipset
 * `istio-inpod-probes-v4/-v6` of Istio, keyed by address.
 */
struct sluice_pod_addr {
	__u8 addr[16]; /* v4 uses the first 4 bytes, the rest zero */
	__u8 family;   /* AF_INET / AF_INET6 */
	__u8 pad[3];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_addr) == 20, "sluice_pod_addr layout");

struct sluice_pod_addr_info {
	__u64 netns_cookie;      /* the pod's counters in pod_stats */
	__u64 node_netns_cookie; /* the netns whose sockets probe it (layout 2) */
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_addr_info) == 16, "sluice_pod_addr_info layout");

/*
 * The node's probe hook (bpf/node_probe.bpf.c): what it did, node-wide,
 * in `probe_stats` (per-CPU array, one counter per index).
 */
#define SLUICE_PROBE_STAT_BOUND 0        /* sockets bound to the probe address */
#define SLUICE_PROBE_STAT_APP_BOUND 1    /* already bound by their app: left as they are */
#define SLUICE_PROBE_STAT_BIND_FAILED 2  /* bpf_bind failed (probe address missing): left as they are */
#define SLUICE_PROBE_STATS 3

/*
 * Probe SNAT state: one element per translated TCP connection, in snat_rev
 * (and snat_closed once it is over), both directions' state in it: keyed by
 * the reply as the pod sends it (pod addr:port -> probe addr:translated
 * port); the value is the original node addr:port, the FIN flags and the
 * pod's cookie. An LRU eviction takes a connection whole.
 */
struct sluice_snat_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 family;
	__u8 pad[3];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_snat_key) == 40, "sluice_snat_key layout");

/* Connection-close tracking in sluice_snat_value.flags. */
#define SLUICE_SNAT_FIN_OUT (1u << 0) /* the prober sent FIN */
#define SLUICE_SNAT_FIN_IN (1u << 1)  /* the pod sent FIN */

struct sluice_snat_value {
	__u8 addr[16]; /* the prober's address */
	__be16 port;   /* the prober's port */
	__u16 flags;   /* SLUICE_SNAT_FIN_*; port, flags and pad form one
			* aligned 64-bit word, which the programs update atomically */
	__u32 pad;
	__u64 netns_cookie;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_snat_value) == 32, "sluice_snat_value layout");

/*
 * ---- The socket mode (capture at the socket instead of at TC). ----
 *
 * Outbound: cgroup connect4/6 programs, attached once per node at a cgroup
 * v2, rewrite the destination of a connect() in an enrolled pod to the
 * proxy's outbound listener at the pod's own address (over lo, the pod's
 * address as source); the original destination is kept on the app's socket
 * (sock_orig) for its getpeername() and, keyed by the app's address and
 * port (orig_dst), for the proxy's SO_ORIGINAL_DST (cgroup getsockopt).
 * DNS (UDP and TCP to port 53): connect4/6 and sendmsg4/6 send it to the
 * DNS listener on loopback, recvmsg4/6 and getpeername give the answer the
 * resolver's address back. Inbound: an sk_lookup program in the pod's netns
 * hands new connections to the proxy's inbound listener (sock_listeners,
 * filled by a sock_ops program when the proxy listens).
 */

/* How a pod's traffic is captured (struct sluice_pod_record.capture). */
enum sluice_capture {
	SLUICE_CAPTURE_TC = 0,     /* TC programs on the pod's interfaces (every record before layout 3) */
	SLUICE_CAPTURE_SOCKET = 1, /* the node's cgroup socket hooks + sk_lookup in the pod's netns */
};

/* The pod's addresses the socket programs need: the source of a captured
 * connection (its first address of the family) and what "the pod itself"
 * is (rule 5: a pod calling its own address is not captured). */
#define SLUICE_SOCK_POD_ADDRS 4

/* Per-pod settings of the socket mode (`pod_sock`, keyed by netns cookie).
 * Absent: the socket programs leave the netns alone. */
struct sluice_pod_sock {
	__u32 flags; /* SLUICE_POD_*, as in pod_config */
	__u8 v4_count;
	__u8 v6_count;
	__u16 pad;
	__u32 reroute_count; /* virtual interfaces: their TC hook decides (not sk_lookup) */
	__u32 reroute_ifindex[SLUICE_MAX_REROUTE_IFACES];
	__be32 v4[SLUICE_SOCK_POD_ADDRS];
	__u8 v6[SLUICE_SOCK_POD_ADDRS][16];
	__u32 pad2;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_sock) == 128, "sluice_pod_sock layout");

/* What the socket programs did with a socket (sluice_sock_orig.kind). */
enum sluice_sock_kind {
	SLUICE_SOCK_NONE = 0,
	SLUICE_SOCK_OUTBOUND = 1, /* an app's connection sent to the outbound listener */
	SLUICE_SOCK_DNS = 2,      /* an app's DNS socket sent to the DNS listener */
	SLUICE_SOCK_ACCEPTED = 3, /* the proxy's accepted socket: its SO_ORIGINAL_DST */
	SLUICE_SOCK_RAW = 4,      /* a raw socket an app of an enrolled pod opened */
};

/*
 * An original destination: family AF_INET with the address in the first 4
 * bytes (IPv4, and IPv4-mapped IPv6 as an app on a dual-stack socket gives
 * it: such an app gets it back v4-mapped), or AF_INET6.
 */
struct sluice_sock_orig {
	__u8 addr[16];
	__be16 port;
	__u8 family;
	__u8 kind; /* enum sluice_sock_kind */
	__u32 pad;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_sock_orig) == 24, "sluice_sock_orig layout");

/* `orig_dst` (LRU): an outbound connection from its connect() until the
 * proxy asked for its SO_ORIGINAL_DST, keyed by the app's end as the
 * proxy's accepted socket sees its peer (v4-mapped as AF_INET) and by
 * where on loopback the connection was sent: connections to different
 * destinations may share the app's port at once (a port space per
 * destination). proxy_lo: for IPv4 the low half of the address in
 * 127.1.0.0/16, for IPv6 the port of [::1] in the block above, both host
 * order; 0 for a connection sent anywhere else (to 15001). The
 * field took two bytes of what was padding (always zero), so an entry
 * filed by an earlier build reads as proxy_lo 0, what it meant then: the
 * byte layout, its version and the pinned map stay. */
struct sluice_orig_key {
	__u64 netns_cookie;
	__u8 addr[16];
	__be16 port;
	__u8 family;
	__u8 pad1;
	__u16 proxy_lo;
	__u16 pad2;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_orig_key) == 32, "sluice_orig_key layout");
#define SLUICE_ORIG_DST_ENTRIES 65536

/*
 * `sock_listeners` (SOCKHASH): the proxy's listeners per pod, port and
 * socket family, each in a slot of its own: an old and a new proxy listen
 * side by side during a hand-over (SO_REUSEPORT), and either may close
 * first. pod_sk_lookup hands a connection to the first slot filled; the
 * kernel then picks within that socket's reuseport group.
 */
#define SLUICE_LISTENER_SLOTS 4
struct sluice_sock_listener_key {
	__u64 netns_cookie;
	__u16 port;  /* host byte order */
	__u8 family; /* of the socket: AF_INET, or AF_INET6 (dual-stack serves both) */
	__u8 slot;   /* 0 .. SLUICE_LISTENER_SLOTS - 1 */
	__u32 pad;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_sock_listener_key) == 16, "sluice_sock_listener_key layout");

/*
 * `proxy_conns` (LRU): the proxy's own connections to its pod's apps with a
 * foreign source (rule 4: the client's address, IP_TRANSPARENT), filed by
 * the sock_ops program when they leave. Their SYN reaches the socket lookup
 * over lo with nothing to tell it from a client's (for local traffic the
 * kernel reports the address's device as the ingress interface), so the
 * sk_lookup program looks the tuple up here to leave it alone.
 */
struct sluice_conn_key {
	__u64 netns_cookie;
	__u8 saddr[16]; /* v4 (and v4-mapped) in the first 4 bytes */
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 family; /* AF_INET for IPv4 and v4-mapped */
	__u8 pad[3];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_conn_key) == 48, "sluice_conn_key layout");
#define SLUICE_PROXY_CONN_ENTRIES 16384

/* `sk_lookup_pod` (per-CPU array, one entry): the pod whose netns the
 * running sk_lookup program serves. sk_lookup programs cannot learn their
 * netns, so each pod's netns gets a tiny program of its own (made by the
 * loader) that writes its pod's cookie here and tail-calls the shared
 * program in `sk_lookup_prog` (a one-slot program array). */
struct sluice_lookup_pod {
	__u64 netns_cookie;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_lookup_pod) == 8, "sluice_lookup_pod layout");

/* Attach mode recorded per pod. */
enum sluice_tc_mode {
	SLUICE_TC_TCX = 1,
	SLUICE_TC_LEGACY = 2,
};

/* Route state recorded per pod (struct sluice_pod_record.routes). */
#define SLUICE_ROUTES_V4 (1u << 0)
#define SLUICE_ROUTES_V6 (1u << 1)

struct sluice_pod_iface {
	char name[SLUICE_IFNAME_LEN];
	__u32 ifindex;
	__s32 accept_local_before; /* sysctl value to restore, -1: untouched */
	__u32 created_clsact;      /* legacy mode: we created the qdisc */
	__u32 pad;
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_iface) == 32, "sluice_pod_iface layout");

/* Key of the `pods` registry: the pod id, NUL-padded. */
struct sluice_pod_id {
	char id[SLUICE_ID_LEN];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_id) == 64, "sluice_pod_id layout");

/*
 * The pod's Kubernetes identity, as the runtime (CNI_ARGS), the API or the
 * Kubernetes watch gave it: what the node proxy is told over ZDS, kept in the
 * registry so that a restarted agent can send its snapshot. Empty strings
 * when unknown (a pod enrolled by hand or by a build before identities).
 */
#define SLUICE_UID_LEN 48           /* metadata.uid: a UUID, 36 characters */
#define SLUICE_K8S_NAME_LEN 256     /* DNS subdomain names: at most 253 */
#define SLUICE_K8S_NAMESPACE_LEN 64 /* DNS labels: at most 63 */
struct sluice_pod_identity {
	char uid[SLUICE_UID_LEN];
	char name[SLUICE_K8S_NAME_LEN];
	char ns[SLUICE_K8S_NAMESPACE_LEN];
	char service_account[SLUICE_K8S_NAME_LEN];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_identity) == 624, "sluice_pod_identity layout");

/* The hand-off of the pod to the node proxy (ZDS AddWorkload and its ack). */
enum sluice_handoff_state {
	SLUICE_HANDOFF_NONE = 0,   /* not handed off (no node proxy connection configured) */
	SLUICE_HANDOFF_ACKED = 1,  /* the node proxy acknowledged the pod */
	SLUICE_HANDOFF_FAILED = 2, /* the last hand-off failed: see error */
};
#define SLUICE_HANDOFF_ERROR_LEN 128
struct sluice_pod_handoff {
	__u32 state; /* enum sluice_handoff_state */
	__u32 pad;
	__u64 at_ns; /* CLOCK_REALTIME of the last change */
	char error[SLUICE_HANDOFF_ERROR_LEN];
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_handoff) == 144, "sluice_pod_handoff layout");

/*
 * The registry of enrolled pods (`pods` hash, keyed by the pod id string):
 * what `pod remove` needs to undo an enrollment, even from another process.
 * Not read by BPF; a map so that it lives and dies with the rest of the
 * pinned state and can be read with bpftool.
 * Layout version 3 (SLUICE_LAYOUT_PODS): version 1 (v0.1.0) ended at addrs,
 * without identity and handoff, version 2 at handoff, without the capture
 * mode (both TC); loader/migrate.cpp converts them.
 */
struct sluice_pod_record {
	char netns_path[SLUICE_NETNS_PATH_LEN];
	__u64 netns_cookie;
	__u64 netns_ino;
	__u64 enrolled_at_ns; /* CLOCK_REALTIME */
	__u32 tc_mode;        /* enum sluice_tc_mode */
	__u32 routes;         /* SLUICE_ROUTES_* */
	__u32 iface_count;
	__u32 lo_ifindex;
	struct sluice_pod_iface ifaces[SLUICE_MAX_POD_IFACES];
	struct sluice_pod_config config;
	/* Node side: the pod's host-side interface and its addresses. */
	char node_netns_path[SLUICE_NETNS_PATH_LEN]; /* empty: sluicectl's own netns */
	__u64 node_netns_cookie;
	struct sluice_pod_iface host_iface; /* ifindex 0: none attached */
	__u32 addr_count;
	__u32 lo_created_clsact; /* legacy mode: we created lo's clsact qdisc */
	struct sluice_pod_addr addrs[SLUICE_MAX_POD_ADDRS];
	/* Since layout 2. */
	struct sluice_pod_identity identity;
	struct sluice_pod_handoff handoff;
	/* Since layout 3. */
	__u32 capture;              /* enum sluice_capture */
	__s32 fwmark_accept_before; /* socket mode: net.ipv4.tcp_fwmark_accept to restore, -1: untouched */
};
SLUICE_STATIC_ASSERT(sizeof(struct sluice_pod_record) ==
			     192 + 24 + 16 + 256 + 104 + 192 + 8 + 32 + 8 + 160 + 624 + 144 + 8,
		     "sluice_pod_record layout");

#endif /* SLUICE_MAPS_H */
