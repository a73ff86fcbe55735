// Attaching programs at TC hooks: tcx links (Linux 6.6+, pinnable, so they
// outlive the process that made them) or clsact + cls_bpf (older kernels;
// the filter stays until removed or the device goes away).
//
// Order against other programs on the same hook (a CNI's, an observability
// tool's): sluice's program runs first. A program before it that ends the
// chain (TC_ACT_OK) would let traffic past the capture, and on the node keep
// probe SNAT from running; sluice's programs hand every packet they decide
// nothing about to the next program (bpf/lib/verdict.h), so going first
// costs the others nothing.
// - tcx: attached with BPF_F_BEFORE and no anchor, i.e. at the front. A
//   program attached later with BPF_F_BEFORE goes ahead of it: the agent's
//   sweep finds that (tcxPosition) and moves sluice's link to the front
//   again (moveTcxToFront).
// - clsact: priority 1, the highest (smallest) there is. A cls_bpf filter
//   someone else holds at priority 1 with protocol "all" shares that
//   priority's list, in which the filter added last runs first; a filter of
//   another kind or protocol at priority 1 makes the attach fail. Filters
//   of earlier sluice builds sat at priority 0x51ce; they are found, moved
//   and removed.
#pragma once

#include <cstdint>
#include <string>

#include "base/result.h"
#include "base/tc_mode.h"

namespace sluice {

enum class TcHook { Ingress, Egress };

const char* tcHookName(TcHook h);

/// Attaches progFd at the front of the hook of ifindex (resolved in the
/// calling thread's netns) as a tcx link pinned at pinPath. The pin holds the
/// attachment. A kernel without tcx gives an Error with code EOPNOTSUPP.
Status attachTcx(int ifindex, TcHook hook, int progFd, const std::string& pinPath);

/// The place of the tcx link pinned at pinPath among the programs of its
/// hook (0: first), from BPF_PROG_QUERY on ifindex (calling thread's netns).
Result<int> tcxPosition(int ifindex, TcHook hook, const std::string& pinPath);

/// Puts progFd at the front of the hook again with no moment without it.
/// tcx refuses a program twice on one hook, so a second instance of the same
/// program (stagingProgFd: the same object loaded again, the same maps) is
/// attached at the front first and takes over the pin, the old link is
/// detached, and the new link is switched to progFd in place. Both
/// instances run for a moment, which is harmless (every sluice program is
/// idempotent on what the other already did).
Status moveTcxToFront(int ifindex, TcHook hook, int progFd, int stagingProgFd, const std::string& pinPath);

/// Detaches the tcx link pinned at pinPath and removes the pin. Missing
/// pin is success; a link whose device is gone is just unpinned.
Status detachTcx(const std::string& pinPath);

/// True when a tcx link is pinned at pinPath and still attached.
bool tcxAttached(const std::string& pinPath);

/// The error for a failed tcx attach (errno err): a kernel without tcx
/// answers EINVAL and gets "kernel lacks tcx" with code EOPNOTSUPP.
Error tcxAttachError(int err, TcHook hook, int ifindex);

/// Attaches progFd as a direct-action cls_bpf filter at priority 1 on a
/// clsact qdisc (created when missing). Returns whether this call created
/// the qdisc.
Result<bool> attachLegacy(int ifindex, TcHook hook, int progFd);

/// Removes sluice's filter from the hook (absent is success; at the old
/// priority too) and, when destroyClsact, the clsact qdisc itself.
Status detachLegacy(int ifindex, TcHook hook, bool destroyClsact);

/// True when sluice's filter on the hook sits at the priority of earlier
/// builds (0x51ce), after filters of lower numbers.
bool legacyAtOldPriority(int ifindex, TcHook hook);

/// Moves sluice's filter from the old priority to priority 1: attached
/// there first, then removed from the old one.
Status moveLegacyToFront(int ifindex, TcHook hook, int progFd);

/// True when sluice's legacy filter is on the hook.
bool legacyAttached(int ifindex, TcHook hook);

/// The kernel's id of the program behind progFd (0 on error).
uint32_t programId(int progFd);

/// The tag (a hash of the instructions) of the program behind @p progFd:
/// the same for two loads of the same program; "" when it cannot be read.
std::string programTag(int progFd);

/// The tag of the program a link (@p linkFd) runs; "" when it cannot be read.
std::string linkedProgramTag(int linkFd);

/// The id of the program a pinned tcx link runs (0: no attached link).
uint32_t tcxProgramId(const std::string& pinPath);

/// Swaps the program of the tcx link pinned at pinPath for progFd in one
/// step (bpf_link_update): no packet sees the hook empty.
Status updateTcx(const std::string& pinPath, int progFd);

/// The id of the program in sluice's legacy filter on the hook (0: none).
uint32_t legacyProgramId(int ifindex, TcHook hook);

/// Replaces the program of sluice's existing legacy filter in place (the
/// filter is changed, not deleted and re-added: no packet misses it).
Status replaceLegacyProgram(int ifindex, TcHook hook, int progFd);

}  // namespace sluice
