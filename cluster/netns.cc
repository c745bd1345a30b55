#include "cluster/netns.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/process/subprocess.h"

extern char** environ;

namespace kvrail::cluster {
namespace {

using process::SpawnOptions;
using process::Subprocess;

constexpr char kPrefix[] = "kvrail-bench-";
constexpr char kIp[] = "ip";

// Runs `ip args...`: its output, or its stderr as the error message.
absl::StatusOr<std::string> RunIpOutput(const std::vector<std::string>& args) {
  SpawnOptions spec = SpawnOptions::ContainedTool();
  spec.argv = {kIp};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.stderr_mode = SpawnOptions::Stderr::kToStdout;
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(spec);
  if (!child.ok()) return child.status();
  absl::StatusOr<std::string> output = (*child)->ReadAll(absl::Seconds(20));
  absl::StatusOr<int> code = (*child)->Wait(absl::Seconds(20));
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::UnavailableError(
        absl::StrCat("netns: `", (*child)->command(), "` failed (exit ", *code,
                     "): ", output.ok() ? absl::StripAsciiWhitespace(*output) : ""));
  }
  return output.ok() ? *output : std::string();
}

absl::Status RunIp(const std::vector<std::string>& args) { return RunIpOutput(args).status(); }

// A veth is usable (UCX lists only running interfaces) once both ends are up and the kernel
// has noticed the carrier, a little after `ip link set up` returns.
absl::Status WaitForCarrier(const NetnsHost& host) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    absl::StatusOr<std::string> link =
        RunIpOutput({"-n", host.netns, "-o", "link", "show", "dev", host.device});
    if (!link.ok()) return link.status();
    if (absl::StrContains(*link, "LOWER_UP") && absl::StrContains(*link, "state UP")) {
      return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::UnavailableError(
          absl::StrCat("netns: ", host.device, " in ", host.netns,
                       " is not up after 10 s: ", absl::StripAsciiWhitespace(*link)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// What a signal handler needs to remove the namespaces: built before the handler may run.
struct SignalCleanup {
  char ip_path[256] = {0};
  char names[2][64] = {{0}};
  struct sigaction previous[3];
  bool armed = false;
};
SignalCleanup g_cleanup;
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};

void OnSignal(int sig) {
  for (char* name : g_cleanup.names) {
    if (name[0] == '\0') continue;
    char netns[] = "netns";
    char del[] = "del";
    char* argv[] = {g_cleanup.ip_path, netns, del, name, nullptr};
    const pid_t pid = fork();
    if (pid == 0) {
      execve(g_cleanup.ip_path, argv, environ);
      _exit(127);
    }
    if (pid > 0) {
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void ArmCleanup(const std::string& a, const std::string& b) {
  const char* ip_path = access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip";
  std::snprintf(g_cleanup.ip_path, sizeof(g_cleanup.ip_path), "%s", ip_path);
  std::snprintf(g_cleanup.names[0], sizeof(g_cleanup.names[0]), "%s", a.c_str());
  std::snprintf(g_cleanup.names[1], sizeof(g_cleanup.names[1]), "%s", b.c_str());
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &action, &g_cleanup.previous[i]);
  g_cleanup.armed = true;
}

void DisarmCleanup() {
  if (!g_cleanup.armed) return;
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_cleanup.previous[i], nullptr);
  g_cleanup.names[0][0] = g_cleanup.names[1][0] = '\0';
  g_cleanup.armed = false;
}

// Removes kvrail-bench-<pid>-* namespaces whose process no longer exists.
void RemoveStale() {
  DIR* dir = opendir("/var/run/netns");
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* entry = readdir(dir)) {
    absl::string_view name = entry->d_name;
    if (!absl::ConsumePrefix(&name, kPrefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(0, name.find('-')), &pid) || pid <= 0) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) stale.emplace_back(entry->d_name);
  }
  closedir(dir);
  for (const std::string& name : stale) (void)RunIp({"netns", "del", name});
}

}  // namespace

std::vector<std::string> NetnsPair::ExecPrefix(const std::string& netns) {
  return {kIp, "netns", "exec", netns};
}

absl::StatusOr<NetnsPair> NetnsPair::Create() {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "--link netns creates two network namespaces and a veth pair, which needs root "
        "(CAP_NET_ADMIN); run as root, or measure tcp and shm only");
  }
  RemoveStale();
  const std::string pid = absl::StrCat(getpid());
  NetnsPair pair;
  pair.initiator_ = {absl::StrCat(kPrefix, pid, "-a"), absl::StrCat("kvb", pid, "a"), "10.213.0.1"};
  pair.target_ = {absl::StrCat(kPrefix, pid, "-b"), absl::StrCat("kvb", pid, "b"), "10.213.0.2"};
  const NetnsHost& a = pair.initiator_;
  const NetnsHost& b = pair.target_;
  ArmCleanup(a.netns, b.netns);
  pair.owned_ = true;  // from here on, the destructor removes whatever was made
  const std::vector<std::vector<std::string>> steps = {
      {"netns", "add", a.netns},
      {"netns", "add", b.netns},
      {"link", "add", a.device, "netns", a.netns, "type", "veth", "peer", "name", b.device, "netns",
       b.netns},
      {"-n", a.netns, "addr", "add", a.address + "/24", "dev", a.device},
      {"-n", b.netns, "addr", "add", b.address + "/24", "dev", b.device},
      {"-n", a.netns, "link", "set", "lo", "up"},
      {"-n", b.netns, "link", "set", "lo", "up"},
      {"-n", a.netns, "link", "set", a.device, "up"},
      {"-n", b.netns, "link", "set", b.device, "up"},
  };
  for (const auto& step : steps) {
    absl::Status status = RunIp(step);
    if (!status.ok()) return status;  // ~NetnsPair removes what was made
  }
  for (const NetnsHost* host : {&a, &b}) {
    absl::Status status = WaitForCarrier(*host);
    if (!status.ok()) return status;
  }
  return pair;
}

NetnsPair::NetnsPair(NetnsPair&& other) noexcept
    : initiator_(std::move(other.initiator_)),
      target_(std::move(other.target_)),
      owned_(std::exchange(other.owned_, false)) {}

NetnsPair::~NetnsPair() { Remove(); }

void NetnsPair::Remove() {
  if (!owned_) return;
  owned_ = false;
  for (const NetnsHost* host : {&initiator_, &target_}) {
    if (access(absl::StrCat("/var/run/netns/", host->netns).c_str(), F_OK) != 0) continue;
    absl::Status status = RunIp({"netns", "del", host->netns});
    if (!status.ok()) std::fprintf(stderr, "warning: %s\n", std::string{status.message()}.c_str());
  }
  DisarmCleanup();
}

}  // namespace kvrail::cluster
