// The command line of one `kvrail sidecar` of a cluster on this machine: the one place that
// turns a node (its `ip netns exec` prefix, host, network devices) and a data plane into
// sidecar flags, for the cluster (cluster.h), on which the fault tests' deployment runs too
// (tests/chaos/deployment.h).
#ifndef KVRAIL_CLUSTER_SIDECAR_COMMAND_H_
#define KVRAIL_CLUSTER_SIDECAR_COMMAND_H_

#include <map>
#include <string>
#include <vector>

namespace kvrail::cluster {

struct SidecarCommand {
  std::string kvrail;               // the kvrail binary
  std::vector<std::string> prefix;  // the node's argv prefix (`ip netns exec <ns>`), or none
  std::string role;                 // "prefill" or "decode"
  std::string engine_endpoint;
  std::string host;  // --host: the address it binds and is reached at
  // The link between the ranks: "shm" or "tcp" (UCX, --tls sm or tcp), or "verbs" (--backend
  // verbs).
  std::string link = "tcp";
  // verbs: --verbs-provider when not empty. "softverbs" with net_devices puts a rail on each
  // device ("veth0,veth1": softverbs0 and softverbs1), so a device set down cuts its rail.
  std::string verbs_provider;
  std::string net_devices;        // UCX: --net-devices when not empty
  std::string bootstrap;          // a prefill's --bootstrap
  std::vector<std::string> args;  // every other flag, appended
};

struct Command {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // added to the inherited environment
};

Command SidecarCommandLine(const SidecarCommand& sidecar);

}  // namespace kvrail::cluster

#endif  // KVRAIL_CLUSTER_SIDECAR_COMMAND_H_
