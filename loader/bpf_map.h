// Typed access to a BPF map: key and value sizes are checked against the
// C++ types when the wrapper is made, so a layout drift between maps/ and
// the loaded object is an error, not silent corruption.
#pragma once

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

/// Number of possible CPUs, as per-CPU maps size their values.
int possibleCpus();

/// A typed view of a map fd it does not own (the skeleton, or the
/// PodPrograms that opened the pin, owns it).
template <typename K, typename V>
class BpfMap {
 public:
  BpfMap() = default;

  /// Checks the map's key and value sizes against K and V.
  static Result<BpfMap> of(const struct bpf_map* map) {
    if (bpf_map__key_size(map) != sizeof(K) || bpf_map__value_size(map) != sizeof(V))
      return Error::msg(std::string("map ") + bpf_map__name(map) + ": key/value size mismatch with maps/sluice_maps.h");
    BpfMap m;
    m.fd_ = bpf_map__fd(map);
    m.name_ = bpf_map__name(map);
    m.percpu_ = bpf_map__type(map) == BPF_MAP_TYPE_PERCPU_HASH || bpf_map__type(map) == BPF_MAP_TYPE_PERCPU_ARRAY ||
                bpf_map__type(map) == BPF_MAP_TYPE_LRU_PERCPU_HASH;
    return m;
  }

  /// A map opened from its pin (the caller owns @p fd): checks the key and
  /// value sizes the kernel reports against K and V.
  static Result<BpfMap> ofFd(int fd, const std::string& name) {
    struct bpf_map_info info = {};
    __u32 len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) return Error::fromErrno(errno, "read map " + name);
    if (info.key_size != sizeof(K) || info.value_size != sizeof(V))
      return Error::msg("map " + name + ": key/value size mismatch with maps/sluice_maps.h");
    BpfMap m;
    m.fd_ = fd;
    m.name_ = name;
    m.percpu_ = info.type == BPF_MAP_TYPE_PERCPU_HASH || info.type == BPF_MAP_TYPE_PERCPU_ARRAY ||
                info.type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
    return m;
  }

  int fd() const { return fd_; }

  /// Looks up key; nullopt when absent. Not for per-CPU maps (lookupPerCpu).
  std::optional<V> lookup(const K& key) const {
    V v{};
    if (bpf_map_lookup_elem(fd_, &key, &v) != 0) return std::nullopt;
    return v;
  }

  /// One value per possible CPU; empty when absent.
  std::vector<V> lookupPerCpu(const K& key) const {
    std::vector<V> vals(possibleCpus());
    static_assert(sizeof(V) % 8 == 0, "per-CPU values are 8-byte aligned");
    if (bpf_map_lookup_elem(fd_, &key, vals.data()) != 0) return {};
    return vals;
  }

  Status update(const K& key, const V& value, __u64 flags = BPF_ANY) const {
    if (percpu_) {
      std::vector<V> vals(possibleCpus(), value);
      if (bpf_map_update_elem(fd_, &key, vals.data(), flags) != 0) return Error::fromErrno(errno, "update map " + name_);
      return {};
    }
    if (bpf_map_update_elem(fd_, &key, &value, flags) != 0) return Error::fromErrno(errno, "update map " + name_);
    return {};
  }

  /// Deletes key; absent is success.
  Status erase(const K& key) const {
    if (bpf_map_delete_elem(fd_, &key) != 0 && errno != ENOENT) return Error::fromErrno(errno, "delete from map " + name_);
    return {};
  }

  /// All keys (snapshot).
  std::vector<K> keys() const {
    std::vector<K> out;
    K cur{}, next{};
    const K* prev = nullptr;
    while (bpf_map_get_next_key(fd_, prev, &next) == 0) {
      out.push_back(next);
      cur = next;
      prev = &cur;
    }
    return out;
  }

 private:
  int fd_ = -1;
  bool percpu_ = false;
  std::string name_;
};

}  // namespace sluice
