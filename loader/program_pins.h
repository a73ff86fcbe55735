// The programs of one build, loaded once per bpffs root and pinned with
// their build identity, so that later processes of the same build (every
// `sluicectl` run, the agent) reuse them with bpf_obj_get instead of
// loading and verifying them again (~150 ms a process).
//
//   <root>/programs/current -> <ID>        symlink: the identity in force
//   <root>/programs/<ID>/pod_egress ...    the TC programs, and the socket
//                                          mode's when the kernel took them
//   <root>/programs/<ID>/record            what the load knew (PinRecord)
//
// The identity is a hash of everything that changes the loaded code: the
// BPF objects embedded in this build (the pod and socket variants chosen by
// feature probing and the node object), the pod-cookie method, the kernel release
// (CO-RE relocations) and libbpf's version. A process whose identity differs
// loads its own programs and switches `current` by rename, so a concurrent
// reader sees the old set or the new one, never half of one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/fd.h"
#include "loader/features.h"
#include "base/result.h"

namespace sluice {

/// The programs, in the order of ProgramPins::progs and PinRecord: the TC
/// mode's five, then the socket mode's (bpf/pod_sock.bpf.c), which a kernel
/// may refuse (then not pinned; the record says why).
enum class PinnedProg {
  PodEgress, PodIngress, PodLoEgress, HostEgress, HostIngress,
  SockConnect4, SockConnect6, SockSendmsg4, SockSendmsg6, SockRecvmsg4, SockRecvmsg6,
  SockGetpeername4, SockGetpeername6, SockGetsockopt, SockSockops, SockSkbIngress, SockSkbEgress,
  SockSkLookup, SockCreate,
  Count
};
constexpr int kPinnedProgs = static_cast<int>(PinnedProg::Count);
constexpr int kFirstSocketProg = static_cast<int>(PinnedProg::SockConnect4);

/// Pin name of a program ("pod_egress"...), also its function name in the
/// BPF object (the kernel keeps its first 15 characters).
const char* pinnedProgName(PinnedProg p);

/// The maps the programs use (all PodPrograms binds, and sock_verdict),
/// in the order their ids are recorded: the TC mode's first, then
/// (from firstSocketMap()) the socket mode's. Their pins are at
/// <root>/<name> (loader/migrate.h versions them).
const std::vector<const char*>& boundMapNames();
/// Index of the first socket-mode map in boundMapNames().
size_t firstSocketMap();

/// This build's identity for programs of pod-cookie method @p method on
/// this kernel: 16 hex digits. Defined beside the skeletons
/// (loader/programs.cpp), which hold the object bytes.
std::string buildIdentity(PodCookieMethod method);

/// One embedded BPF object's bytes.
struct ElfBytes {
  const void* data;
  size_t size;
};

/// The identity of programs loaded from these objects with @p method on
/// this kernel and libbpf (what buildIdentity hashes).
std::string identityOf(const std::vector<ElfBytes>& objects, PodCookieMethod method);

/// <root>/programs
std::string programsDir(const std::string& root);

/// The programs and maps found pinned for this build, ready to use.
struct ProgramPins {
  std::string identity;
  Fd progs[kPinnedProgs];  ///< the socket mode's invalid when socketError is set
  std::vector<Fd> maps;  ///< boundMapNames() order (likewise)
  FeatureReport features;  ///< as probed by the process that loaded them
  std::string socketError;  ///< why the kernel refused the socket programs ("" it took them)
};

/// Looks for this build's programs under @p root (StateLock held).
/// nullopt: none to reuse (nothing pinned, another identity, the
/// SLUICE_POD_COOKIE override differs, the maps were re-created since, or
/// snat_rev has another capacity than @p snatEntries) -- the caller loads.
/// An error (one line, naming the path and what to do): the pins carry
/// this build's identity but are not what this build pinned (a foreign or
/// damaged object).
Result<std::optional<ProgramPins>> openProgramPins(const std::string& root, uint32_t snatEntries);

/// Pins freshly loaded programs as this build's identity and makes it the
/// current one (StateLock held); other identities' pins are removed (a hook
/// holds its own reference to its program, so attached pods keep running
/// whatever they run). @p progFds in PinnedProg order, @p mapFds in
/// boundMapNames() order; the socket mode's are -1 when the kernel refused
/// its programs, @p socketError saying why.
Status pinPrograms(const std::string& root, const FeatureReport& features, const int (&progFds)[kPinnedProgs],
                   const std::vector<int>& mapFds, const std::string& socketError);

/// Removes what is under <root>/programs besides the current identity:
/// older identities' pins, a crashed load's half-written directory.
/// Returns what was removed (names).
Result<std::vector<std::string>> removeStaleProgramPins(const std::string& root);

/// What `sluicectl status` shows about the pinned programs.
struct PinnedProgramsInfo {
  std::string identity;        ///< empty: none pinned
  std::string cookieMethod;    ///< of the pinned programs
  uint64_t loadedAtNs = 0;     ///< CLOCK_REALTIME of their load
  bool thisBuild = false;      ///< this build would reuse them
  std::vector<uint32_t> programIds;  ///< PinnedProg order
  std::string problem;         ///< why they cannot be read, if so
};

/// Reads the pinned identity without taking the lock or changing anything.
PinnedProgramsInfo inspectProgramPins(const std::string& root);

}  // namespace sluice
