// Pinned state across builds: every pinned map has a layout version
// (maps/sluice_maps.h, SLUICE_LAYOUT_*), recorded in the pinned `layouts`
// map. Before libbpf reuses the pins, a build compares them with its own
// layouts: equal ones are reused as they are, older ones are migrated (the
// old map is set aside, libbpf creates the new one, its entries are copied
// over converted), and a layout this build cannot read stops the load with
// one line, before anything is changed — the running data plane stays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "loader/bpf_map.h"
#include "maps/sluice_maps.h"

struct bpf_object;

namespace sluice {

/// The loaded maps a migration fills and records layouts in (the pod
/// programs' own, passed in so that this file needs nothing of programs.h,
/// which drives the migration).
struct MigrationMaps {
  BpfMap<sluice_pod_id, sluice_pod_record>& pods;
  BpfMap<sluice_pod_addr, sluice_pod_addr_info>& podAddrs;
  BpfMap<sluice_snat_key, sluice_snat_value>& snatRev;
  BpfMap<sluice_layout_key, sluice_layout_value>& layouts;
};

/// A map this build pins: its name (= pin name) and layout version.
struct MapLayout {
  const char* name;
  uint32_t version;
};

/// Every map this build pins, with its layout version.
const std::vector<MapLayout>& mapLayouts();

/// The layout versions pinned under a root, read without changing anything.
/// Maps pinned before `layouts` existed (v0.1.0) are version 1.
struct PinnedLayout {
  std::string name;
  uint32_t version = 0;
};

/// What a load must do about the pins under a root. Call with the
/// StateLock held, on an opened (not yet loaded) object.
class Migration {
 public:
  /// Compares the pins under @p root with the maps of @p objs (every map of
  /// mapLayouts() is defined by one of them) and this build's layouts.
  /// Errors (EPROTO), nothing changed: a map pinned with a newer layout, or
  /// an older one this build has no migration from, or a pin whose
  /// definition differs from this build's at the same version.
  static Result<Migration> plan(const std::string& root, const std::vector<const struct bpf_object*>& objs);

  /// Maps whose pins will be migrated ("pods 1 -> 2"), for the log.
  std::vector<std::string> describe() const;
  bool needed() const { return !steps_.empty(); }

  /// Sets the pins of the maps to migrate aside (as migrate/NAME-vN under
  /// the root), so that the load creates maps of this build's layouts. A
  /// migration interrupted after this step is resumed by the next load (the
  /// set-aside pin is found again).
  Status prepare();

  /// After the load: fills the new maps from the old ones, records every
  /// map's layout in `layouts`, and unpins the old maps. The old maps live
  /// on while an attached program still uses them (until the hooks are
  /// switched to the new programs).
  Status complete(MigrationMaps maps);

 private:
  struct Step {
    std::string name;
    uint32_t from = 0;
    uint32_t to = 0;
    std::string asidePin;  ///< where the old map is pinned during the migration
    bool resumed = false;  ///< found set aside by an interrupted migration
  };
  std::string root_;
  std::vector<Step> steps_;
};

/// True when `layouts` under @p root records exactly this build's layout
/// of every map and no migration is under way: what a process reusing
/// pinned programs checks, since a layout change needs a load (and the
/// refusals of Migration::plan).
Result<bool> pinnedLayoutsAreThisBuilds(const std::string& root);

/// Reads the layouts pinned under @p root (for `sluicectl status` and
/// tests); empty when nothing is pinned.
Result<std::vector<PinnedLayout>> pinnedLayouts(const std::string& root);

}  // namespace sluice
