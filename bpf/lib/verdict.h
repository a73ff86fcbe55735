/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What the programs return. sluice shares its hooks with other programs (a
 * CNI's, an observability tool's), attached first at every hook (loader/
 * tc.h), and hands on what it has nothing to say about. tcx and cls_bpf in
 * direct-action mode give the same numbers the same meaning, so one
 * program serves both attach modes:
 *
 *   SLUICE_NEXT  -1  tcx: TCX_NEXT; clsact: TC_ACT_UNSPEC -- the next
 *                    program (tcx) or filter (clsact) runs; after the last
 *                    one the packet goes on as usual. For packets sluice
 *                    does not touch, and for the ones it only translated
 *                    (probe SNAT, DNS answers): the rest of the chain sees
 *                    the translated packet, as TC programs see a packet
 *                    after Istio's netfilter NAT.
 *   SLUICE_DONE   0  TCX_PASS / TC_ACT_OK -- delivered as it is now, no
 *                    later program runs. For packets sluice looped from
 *                    egress to ingress: its own business, handed to the
 *                    proxy's socket.
 *   TC_ACT_SHOT, TC_ACT_REDIRECT: final, as always.
 */
#pragma once

#define SLUICE_NEXT (-1)
#define SLUICE_DONE 0
