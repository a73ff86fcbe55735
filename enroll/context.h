// What a pod's steps work with: its record (filled in as they apply), the
// programs and maps, the settings, its pin directory, what discovery found
// in its netns, and what the runner provides inside a netns.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/fd.h"
#include "enroll/handoff.h"
#include "enroll/settings.h"
#include "loader/netlink.h"
#include "loader/programs.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// What the steps ask of the Datapath that runs them.
struct DatapathServices {
  /// Socket mode: the node-wide hooks in place (cached per process;
  /// @p full: every link read back, as a repair needs, not the cache).
  std::function<Status(bool full)> ensureNodeHooks;
  /// The node's probe hook in place (cached per process; @p full: read
  /// back, as a repair needs).
  std::function<Status(bool full)> ensureProbeHook;
  /// The cgroup the node hooks attach at.
  std::function<Result<std::string>()> nodeCgroup;
  /// A second instance of the programs, to move a tcx link to the front.
  std::function<Result<PodPrograms*>()> staging;
  /// Removes pod @p id, whose netns is gone and which holds @p held.
  std::function<Status(const std::string& id, const sluice_pod_record& rec, const std::string& held)> reapStale;
};

struct PodContext {
  std::string id;
  sluice_pod_record rec{};
  PodPrograms* programs = nullptr;
  const Settings* settings = nullptr;
  std::string root;     ///< bpffs root
  std::string linkDir;  ///< <root>/links/<id> (enroll/pins.h)
  DatapathServices services;

  // Found in the pod's netns at enrollment (enroll/discover.h).
  int podVethIfindex = 0;  ///< the pod's veth towards the node (eth0 first)
  int peerIfindex = 0;     ///< its peer's ifindex, in the node netns
  /// Socket mode: the pod's addresses for pod_sock (nullopt: found in the
  /// pod's netns when needed, from the record's or its interfaces').
  std::optional<std::vector<sluice_pod_addr>> sockAddrs;
  /// The hand-off step's supplier (add only).
  const Handoff* handoff = nullptr;
  bool handedOff = false;  ///< the hand-off was tried (undo takes it back)

  /// The pod's netns as the enrollment opened it (its cookie read through
  /// this fd by discovery): the runner enters it without opening the path
  /// again or checking the cookie, as an open fd cannot name another netns.
  /// Invalid outside an enrollment: the runner opens the recorded path and
  /// checks the recorded cookie.
  Fd heldPodNetns;

  // Provided by the runner inside the pod's netns.
  int podNetnsFd = -1;
  /// The pod netns' interfaces; listed once per entry (or by discovery).
  std::optional<std::vector<LinkInfo>> podLinks;
  bool inPodNetns = false;  ///< the runner is in the pod's netns now
  /// A netlink socket of the pod's netns, opened on first use there (it
  /// stays in the pod's netns when the thread leaves).
  Result<NetlinkSocket*> podNetlink();
  /// The pod's interfaces (listed on first use in its netns).
  Result<const std::vector<LinkInfo>*> podInterfaces();
  /// The pod interface @p ifindex, when it still has @p name (nullptr: gone
  /// or renamed, or the interfaces cannot be listed).
  const LinkInfo* podLink(int ifindex, const std::string& name);

  /// An undo failed: the record stays, so that removal can be retried.
  bool undoFailed = false;

  /// Writes the record to the registry.
  Status saveRecord();

 private:
  std::optional<NetlinkSocket> nl_;
};

}  // namespace sluice
