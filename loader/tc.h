// Attaching programs at TC hooks: tcx links (Linux 6.6+, pinnable, so they
// outlive the process that made them) or clsact + cls_bpf (older kernels;
// the filter stays until removed or the device goes away).
#pragma once

#include <cstdint>
#include <string>

#include "loader/result.h"
#include "loader/tc_mode.h"

namespace sluice {

enum class TcHook { Ingress, Egress };

const char* tcHookName(TcHook h);

/// Attaches progFd at the hook of ifindex (resolved in the calling thread's
/// netns) as a tcx link pinned at pinPath. The pin holds the attachment.
/// A kernel without tcx gives an Error with code EOPNOTSUPP.
Status attachTcx(int ifindex, TcHook hook, int progFd, const std::string& pinPath);

/// Detaches the tcx link pinned at pinPath and removes the pin. Missing
/// pin is success; a link whose device is gone is just unpinned.
Status detachTcx(const std::string& pinPath);

/// True when a tcx link is pinned at pinPath and still attached.
bool tcxAttached(const std::string& pinPath);

/// The error for a failed tcx attach (errno err): a kernel without tcx
/// answers EINVAL and gets "kernel lacks tcx" with code EOPNOTSUPP.
Error tcxAttachError(int err, TcHook hook, int ifindex);

/// Attaches progFd as a direct-action cls_bpf filter on a clsact qdisc
/// (created when missing). Returns whether this call created the qdisc.
Result<bool> attachLegacy(int ifindex, TcHook hook, int progFd);

/// Removes sluice's filter from the hook (absent is success) and, when
/// destroyClsact, the clsact qdisc itself.
Status detachLegacy(int ifindex, TcHook hook, bool destroyClsact);

/// True when sluice's legacy filter is on the hook.
bool legacyAttached(int ifindex, TcHook hook);

/// The kernel's id of the program behind progFd (0 on error).
uint32_t programId(int progFd);

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
