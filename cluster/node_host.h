// Where one node of a deployment on this machine runs: the cluster's nodes (cluster.h), the
// data-plane test nodes (tests/transfer/harness.h) and `kvrail bench raw`'s two sides.
#ifndef KVRAIL_CLUSTER_NODE_HOST_H_
#define KVRAIL_CLUSTER_NODE_HOST_H_

#include <string>
#include <vector>

namespace kvrail::cluster {

// One node's host: the argv prefix that runs its processes there (`ip netns exec <ns>`, or
// none), the address they bind and are reached at, and their UCX tcp device (empty: UCX's
// choice).
struct NodeHost {
  std::vector<std::string> prefix;
  std::string host = "127.0.0.1";
  std::string net_devices;
};

}  // namespace kvrail::cluster

#endif  // KVRAIL_CLUSTER_NODE_HOST_H_
