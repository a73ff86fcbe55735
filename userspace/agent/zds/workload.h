// What the node agent and ztunnel say about a pod over ZDS, independent of
// the protobuf encoding (wire.h turns these into datagrams).
#pragma once

#include <string>

namespace sluice::zds {

/// The identity of one pod as ztunnel learns it: the uid keys every request,
/// the rest is the AddWorkload's workload_info.
struct WorkloadInfo {
  std::string uid;             ///< metadata.uid
  std::string name;            ///< pod name
  std::string ns;              ///< pod namespace
  std::string serviceAccount;  ///< spec.serviceAccountName
};

/// The four requests the agent sends (WorkloadRequest's oneof).
enum class RequestType { Add, Keep, Del, SnapshotSent };

/// "add" | "keep" | "del" | "snapshot_sent": metric labels and logs.
const char* requestTypeName(RequestType type);

/// One decoded WorkloadRequest.
struct Request {
  RequestType type = RequestType::SnapshotSent;
  /// Add: uid and workload_info; Keep / Del: uid only.
  WorkloadInfo workload;
  /// Add only: whether workload_info was present (ztunnel requires it).
  bool hasWorkloadInfo = false;
};

}  // namespace sluice::zds
