// Every thread of a running sidecar carries a name (docs/ARCHITECTURE.md, "Threads"): one that
// kvrail gave it, or the one its library gives its own (ZeroMQ's, UCX's). A thread that kept the
// process's name is one nobody can tell apart in top -H, perf or gdb.
#include <dirent.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "control/sidecar/sidecar.h"

namespace kvrail::sidecar {
namespace {

std::string Comm(const std::string& path) {
  std::ifstream in(path);
  std::string name;
  std::getline(in, name);
  return name;
}

// This process's threads but the calling one (the test's main thread): tid -> name.
std::map<std::string, std::string> OtherThreads() {
  std::map<std::string, std::string> threads;
  const std::string self = std::to_string(gettid());
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return threads;
  while (dirent* entry = readdir(dir)) {
    const std::string tid = entry->d_name;
    if (tid == "." || tid == ".." || tid == self) continue;
    threads[tid] = Comm("/proc/self/task/" + tid + "/comm");
  }
  closedir(dir);
  return threads;
}

void ExpectEveryThreadNamed(Role role) {
  SidecarOptions options;
  options.role = role;
  options.engine_endpoint = "tcp://127.0.0.1:0";
  options.tls = "tcp";
  options.lanes = 2;
  options.bootstrap = "127.0.0.1:1";  // a prefill's (asked only once an arena attaches)
  // Threads there before the sidecar are not its own: ThreadSanitizer starts its background
  // thread at the process's first pthread_create, so one thread is made (and joined) first.
  std::thread([] {}).join();
  const std::map<std::string, std::string> before = OtherThreads();
  auto sidecar = Sidecar::Start(options);
  ASSERT_TRUE(sidecar.ok()) << sidecar.status();
  const std::string process = Comm("/proc/self/comm");
  // A thread is named by its starter right after it starts (engine/sync/thread_name.h): one
  // just started may not carry its name yet. Read until none keeps the process's, for 2 s.
  std::multiset<std::string> names;
  for (int attempt = 0; attempt < 200; ++attempt) {
    names.clear();
    for (const auto& [tid, name] : OtherThreads()) {
      if (before.count(tid) == 0) names.insert(name);
    }
    if (names.count(process) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(names.count(process), 0u)
      << names.count(process) << " thread(s) kept the process's name " << process
      << "; the others: " << absl::StrJoin(names, ", ");
  // The room state's owner is the engine API's thread (owner_loop.h, Driven); one thread runs
  // what the owner defers.
  EXPECT_EQ(names.count("kvrail-engapi"), 1u) << absl::StrJoin(names, ", ");
  EXPECT_EQ(names.count("kvrail-effects0"), 1u) << absl::StrJoin(names, ", ");
}

TEST(ThreadNamesTest, EveryThreadOfADecodeSidecarHasAName) {
  ExpectEveryThreadNamed(Role::kDecode);
}

TEST(ThreadNamesTest, EveryThreadOfAPrefillSidecarHasAName) {
  ExpectEveryThreadNamed(Role::kPrefill);
}

}  // namespace
}  // namespace kvrail::sidecar
