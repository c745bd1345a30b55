#include "engine/transport/peer_process.h"

#include <errno.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrail::transport {
namespace {

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

// The inode of `pid`'s pid namespace ("self" for this process); 0 when unreadable.
uint64_t PidNamespace(const std::string& pid) {
  struct stat st {};
  if (stat(absl::StrCat("/proc/", pid, "/ns/pid").c_str(), &st) != 0) return 0;
  return st.st_ino;
}

// Field 22 of /proc/<pid>/stat, the process's start time in clock ticks since boot; 0 when
// unreadable. The name (field 2) may hold spaces and parentheses: the fields after it are
// counted from its last ')'.
uint64_t StartTicks(const std::string& pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) return 0;
  // After the name: field 3 (state) onwards; the start time is field 22, the 20th of these.
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(name_end + 1), ' ', absl::SkipEmpty());
  uint64_t ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) return 0;
  return ticks;
}

}  // namespace

v1::ProcessIdentity ProcessIdentityOf(int pid) {
  v1::ProcessIdentity identity;
  identity.set_boot_id(BootId());
  identity.set_pid_namespace(PidNamespace(std::to_string(pid)));
  identity.set_pid(static_cast<uint32_t>(pid));
  identity.set_start_ticks(StartTicks(std::to_string(pid)));
  return identity;
}

v1::ProcessIdentity SelfProcess() {
  // A /proc of another pid namespace than this process's (unshare -p without its own /proc)
  // names other processes by these pids: then nothing is published, and nothing is watched.
  const v1::ProcessIdentity self = ProcessIdentityOf(getpid());
  if (self.start_ticks() == 0 || self.start_ticks() != StartTicks("self")) {
    return v1::ProcessIdentity();
  }
  return self;
}

std::unique_ptr<PeerProcess> PeerProcess::Watch(const v1::ProcessIdentity& identity) {
  if (identity.pid() == 0 || identity.start_ticks() == 0 || identity.boot_id().empty() ||
      identity.pid_namespace() == 0) {
    return nullptr;
  }
  const v1::ProcessIdentity self = SelfProcess();
  if (self.pid() == 0 || identity.boot_id() != self.boot_id() ||
      identity.pid_namespace() != self.pid_namespace()) {
    return nullptr;
  }
  const int pid = static_cast<int>(identity.pid());
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    // No such pid in this namespace: the process has gone (and been reaped).
    if (errno == ESRCH) return std::unique_ptr<PeerProcess>(new PeerProcess(-1, pid));
    return nullptr;
  }
  // Read after the pidfd was opened: a pid that a new process took since has another start
  // time, so a match means the pidfd is the identity's own process, and another one that it
  // has gone.
  const uint64_t ticks = StartTicks(std::to_string(pid));
  if (ticks == 0) {
    close(pidfd);
    return nullptr;
  }
  if (ticks != identity.start_ticks()) {
    close(pidfd);
    return std::unique_ptr<PeerProcess>(new PeerProcess(-1, pid));
  }
  return std::unique_ptr<PeerProcess>(new PeerProcess(pidfd, pid));
}

PeerProcess::~PeerProcess() {
  if (pidfd_ >= 0) close(pidfd_);
}

bool PeerProcess::Exited() const {
  if (pidfd_ < 0) return true;
  pollfd watch{pidfd_, POLLIN, 0};
  return poll(&watch, 1, 0) > 0 && (watch.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace kvrail::transport
