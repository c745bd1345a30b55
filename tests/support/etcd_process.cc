#include "tests/support/etcd_process.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/registry/etcd_client.h"
#include "tests/support/ports.h"

namespace kvrail::registry {

namespace {

// The last `lines` lines of the file at `path`, each indented, for an error message.
std::string LogTail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(std::move(line));
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  std::string out;
  for (const std::string& line : tail) absl::StrAppend(&out, "\n  | ", line);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(int client_port,
                                                                std::string data_dir,
                                                                absl::Duration timeout) {
  // A port the kernel called free can be taken by another test before etcd binds it; etcd then
  // exits at start. Each try picks its ports again (the peer port, and the client port unless
  // the caller gave one), up to 3 tries.
  std::string reasons;
  for (int attempt = 0; attempt < 3; ++attempt) {
    bool exited = false;
    auto etcd = StartOnce(client_port, data_dir, timeout, &exited);
    if (etcd.ok()) return etcd;
    absl::StrAppend(&reasons, reasons.empty() ? "" : "\n", etcd.status().message());
    if (!exited) break;
  }
  return absl::UnavailableError(reasons);
}

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::StartOnce(int client_port,
                                                                    std::string data_dir,
                                                                    absl::Duration timeout,
                                                                    bool* exited) {
  static std::atomic<int> serial{0};
  if (client_port == 0) {
    auto port = testing::FreePort();
    if (!port.ok()) return port.status();
    client_port = *port;
  }
  auto peer_port = testing::FreePort();
  if (!peer_port.ok()) return peer_port.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = tmp != nullptr ? tmp : "/tmp";
  if (data_dir.empty()) {
    data_dir = absl::StrCat(base, "/etcd-", process::ProcessTag(), "-", serial++);
  }
  std::error_code ignored;
  std::filesystem::create_directories(data_dir, ignored);
  const std::string client_url = absl::StrCat("http://127.0.0.1:", client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", *peer_port);
  const std::string log = data_dir + ".log";
  process::SpawnOptions options;
  options.argv = {"/usr/bin/etcd",
                  "--name",
                  "kvrail-test",
                  "--data-dir",
                  data_dir,
                  "--listen-client-urls",
                  client_url,
                  "--advertise-client-urls",
                  client_url,
                  "--listen-peer-urls",
                  peer_url,
                  "--initial-advertise-peer-urls",
                  peer_url,
                  "--initial-cluster",
                  "kvrail-test=" + peer_url,
                  "--log-outputs",
                  "stderr"};
  options.pipe_stdin = false;
  options.pipe_stdout = false;
  options.stderr_mode = process::SpawnOptions::Stderr::kFile;
  options.stderr_path = log;
  options.contained = true;
  auto child = process::Subprocess::Start(options);
  if (!child.ok()) return child.status();
  auto etcd = std::unique_ptr<EtcdProcess>(new EtcdProcess());
  etcd->child_ = std::move(*child);
  etcd->client_port_ = client_port;
  etcd->endpoint_ = absl::StrCat("127.0.0.1:", client_port);
  etcd->data_dir_ = data_dir;
  EtcdClient client(etcd->endpoint_, absl::Milliseconds(500));
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status health = client.Health();
  while (!health.ok() && absl::Now() < deadline) {
    if (etcd->child_->Wait(absl::ZeroDuration()).ok()) {
      *exited = true;
      return absl::UnavailableError(absl::StrCat("etcd on ", etcd->endpoint_,
                                                 " exited at start; the end of its log (", log,
                                                 "):", LogTail(log, 8)));
    }
    absl::SleepFor(absl::Milliseconds(50));
    health = client.Health();
  }
  if (!health.ok()) {
    return absl::UnavailableError(
        absl::StrCat("etcd on ", etcd->endpoint_, " did not come up: ", health.message(),
                     "; the end of its log (", log, "):", LogTail(log, 8)));
  }
  return etcd;
}

EtcdProcess::~EtcdProcess() { Kill(); }

void EtcdProcess::Kill() {
  if (child_ == nullptr) return;
  child_->Signal(SIGKILL);
  (void)child_->Wait(absl::Seconds(10));
  child_.reset();
}

}  // namespace kvrail::registry
