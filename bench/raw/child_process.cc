#include "bench/raw/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

extern char** environ;

namespace kvrail::bench {
namespace {

std::string Errno(int error) {
  return absl::StrFormat("%s (errno %d)", std::strerror(error), error);
}

bool IsExecutable(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

absl::StatusOr<std::string> ResolvePath(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (!IsExecutable(name)) return absl::NotFoundError(absl::StrCat(name, ": not an executable"));
    return name;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  // Root's tools (ip) live in sbin, often missing from a user's PATH.
  for (const char* dir : {"/usr/sbin", "/sbin"}) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(name, ": not found in PATH"));
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

absl::StatusOr<ChildProcess> ChildProcess::Spawn(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("child process: empty argv");
  absl::StatusOr<std::string> path = ResolvePath(spec.argv[0]);
  if (!path.ok()) return path.status();

  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : spec.env) replaced = replaced || k == key;
    if (!replaced) env_strings.emplace_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<char*> argv;
  argv.reserve(argv_strings.size() + 1);
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {in_pipe, out_pipe, exec_pipe}) {
      CloseFd(p[0]);
      CloseFd(p[1]);
    }
  };
  if ((spec.pipe_stdin && pipe2(in_pipe, O_CLOEXEC) != 0) ||
      (spec.pipe_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) || pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    close_all();
    return absl::InternalError(absl::StrCat("child process: pipe2: ", Errno(error)));
  }
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close_all();
    if (null_fd >= 0) close(null_fd);
    return absl::InternalError(absl::StrCat("child process: fork: ", Errno(error)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    dup2(spec.pipe_stdin ? in_pipe[0] : null_fd, 0);
    if (spec.pipe_stdout) dup2(out_pipe[1], 1);
    if (spec.stderr_mode == ChildSpec::Stderr::kToStdout) {
      dup2(spec.pipe_stdout ? out_pipe[1] : 1, 2);
    }
    if (spec.stderr_mode == ChildSpec::Stderr::kNull) dup2(null_fd, 2);
    // Signals the parent blocked or ignored stay so across exec: restore the defaults.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    execve(path->c_str(), argv.data(), envp.data());
    const int error = errno;
    (void)!write(exec_pipe[1], &error, sizeof(error));
    _exit(127);
  }
  if (null_fd >= 0) close(null_fd);
  CloseFd(in_pipe[0]);
  CloseFd(out_pipe[1]);
  CloseFd(exec_pipe[1]);
  int exec_error = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  CloseFd(exec_pipe[0]);
  ChildProcess child;
  child.pid_ = pid;
  child.stdin_fd_ = in_pipe[1];
  child.stdout_fd_ = out_pipe[0];
  child.command_ = absl::StrJoin(spec.argv, " ");
  if (n == static_cast<ssize_t>(sizeof(exec_error))) {
    child.Stop(absl::ZeroDuration());
    return absl::InternalError(absl::StrCat("exec ", *path, ": ", Errno(exec_error)));
  }
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Reset();
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = other.reaped_;
    exit_code_ = other.exit_code_;
    stdin_fd_ = std::exchange(other.stdin_fd_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    eof_ = other.eof_;
    buffer_ = std::move(other.buffer_);
    command_ = std::move(other.command_);
  }
  return *this;
}

ChildProcess::~ChildProcess() { Reset(); }

void ChildProcess::Reset() {
  if (pid_ > 0 && !reaped_) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  pid_ = -1;
  reaped_ = false;
  CloseFd(stdin_fd_);
  CloseFd(stdout_fd_);
}

absl::Status ChildProcess::WriteLine(const std::string& line) {
  if (stdin_fd_ < 0) return absl::FailedPreconditionError(command_ + ": stdin is not a pipe");
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(stdin_fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat(command_, ": write to stdin: ", Errno(errno)));
    }
    done += n;
  }
  return absl::OkStatus();
}

void ChildProcess::CloseStdin() { CloseFd(stdin_fd_); }

absl::Status ChildProcess::Fill(absl::Time deadline) {
  if (stdout_fd_ < 0) return absl::FailedPreconditionError(command_ + ": stdout is not a pipe");
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(command_, ": no output in time"));
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
    if (ready == 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat(command_, ": read: ", Errno(errno)));
    if (n == 0) {
      eof_ = true;
      return absl::OkStatus();
    }
    buffer_.append(chunk, n);
    return absl::OkStatus();
  }
}

absl::StatusOr<std::string> ChildProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    if (eof_) {
      return absl::UnavailableError(
          absl::StrCat(command_, ": exited (end of its output) before writing a line"));
    }
    absl::Status status = Fill(deadline);
    if (!status.ok()) return status;
  }
}

absl::StatusOr<std::string> ChildProcess::ReadAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!eof_) {
    absl::Status status = Fill(deadline);
    if (!status.ok()) return status;
  }
  return std::exchange(buffer_, std::string());
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no child process");
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration nap = absl::Microseconds(200);
  while (!reaped_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::InternalError(absl::StrCat("waitpid: ", Errno(errno)));
    if (r == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("%s: still running after %s", command_, absl::FormatDuration(timeout)));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(20));
  }
  return exit_code_;
}

void ChildProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0 || reaped_) return;
  kill(-pid_, SIGTERM);
  kill(pid_, SIGTERM);
  if (!Wait(grace).ok()) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    (void)Wait(absl::Seconds(10));
  }
}

}  // namespace kvrail::bench
