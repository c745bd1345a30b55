// Two hosts on one machine: two network namespaces joined by a veth pair, with addresses that
// exist only inside them (docs MACHINE-NOTES, "Two hosts on one machine"). Needs root.
#ifndef KVRAIL_CLUSTER_NETNS_H_
#define KVRAIL_CLUSTER_NETNS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrail::cluster {

// One end: the namespace, its veth interface and that interface's IPv4 address.
struct NetnsHost {
  std::string netns;
  std::string device;
  std::string address;
};

class NetnsPair {
 public:
  // Creates namespaces "kvrail-bench-<pid>-a" and "-b", a veth pair with one end in each,
  // 10.213.0.1/24 and 10.213.0.2/24 on them, and every link up. First removes namespaces left
  // by earlier runs whose process is gone. FailedPrecondition without root; otherwise the `ip`
  // command that failed and its message. Nothing is left behind on failure.
  //
  // Until the pair is destroyed, SIGINT, SIGTERM and SIGHUP remove both namespaces before the
  // process dies of the signal.
  static absl::StatusOr<NetnsPair> Create();

  NetnsPair(NetnsPair&& other) noexcept;
  NetnsPair& operator=(NetnsPair&&) = delete;
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;
  // Removes both namespaces (the veth pair goes with them).
  ~NetnsPair();

  const NetnsHost& initiator() const { return initiator_; }
  const NetnsHost& target() const { return target_; }

  // The argv prefix that runs a command inside `netns`: ip netns exec <netns>.
  static std::vector<std::string> ExecPrefix(const std::string& netns);

 private:
  NetnsPair() = default;
  void Remove();

  NetnsHost initiator_;
  NetnsHost target_;
  bool owned_ = false;
};

}  // namespace kvrail::cluster

#endif  // KVRAIL_CLUSTER_NETNS_H_
