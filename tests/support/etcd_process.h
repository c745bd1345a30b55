// For tests: a real etcd (/usr/bin/etcd, Debian's etcd-server) as a single member on 127.0.0.1,
// with client and peer ports the kernel picked free and its data under $TEST_TMPDIR. Killed (its
// whole process group) when the object goes.
#ifndef KVRAIL_TESTS_SUPPORT_ETCD_PROCESS_H_
#define KVRAIL_TESTS_SUPPORT_ETCD_PROCESS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/process/subprocess.h"

namespace kvrail::registry {

class EtcdProcess {
 public:
  // Starts etcd and waits (up to `timeout`) until GET /health answers true. `client_port` 0:
  // one picked free; give the old one to start etcd again where it was, on the same data
  // directory `data_dir` ("" makes a fresh one). Ports are picked again (up to 3 tries) when
  // etcd exits at start, as it does when another process took one first. Unavailable, with the
  // end of etcd's log, when it does not come up.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      int client_port = 0, std::string data_dir = "", absl::Duration timeout = absl::Seconds(20));
  ~EtcdProcess();

  // "127.0.0.1:<client port>", for EtcdClient and --registry etcd://...
  const std::string& endpoint() const { return endpoint_; }
  int client_port() const { return client_port_; }
  const std::string& data_dir() const { return data_dir_; }
  // SIGKILL and reap (the data directory stays).
  void Kill();

 private:
  EtcdProcess() = default;
  // One start; `*exited` says whether etcd exited before it was healthy.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> StartOnce(int client_port,
                                                                std::string data_dir,
                                                                absl::Duration timeout,
                                                                bool* exited);
  std::unique_ptr<process::Subprocess> child_;
  std::string endpoint_;
  std::string data_dir_;
  int client_port_ = 0;
};

}  // namespace kvrail::registry

#endif  // KVRAIL_TESTS_SUPPORT_ETCD_PROCESS_H_
