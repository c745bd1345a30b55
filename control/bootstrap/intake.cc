#include "control/bootstrap/intake.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvrail::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kReadChunk = size_t{64} << 10;
// After accept() runs out of descriptors (EMFILE), how long before it is tried again; the
// listening socket stays readable meanwhile, so polling it would spin.
constexpr milliseconds kAcceptPause{50};
constexpr int kAcceptsPerWake = 64;
constexpr absl::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

absl::string_view ReasonPhrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

// A whole answer with a one-line text body, as httplib would write it, closing the connection.
std::string AnswerBytes(int status, absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status),
                      "\r\nConnection: close\r\nContent-Length: ", body.size(),
                      "\r\nContent-Type: text/plain\r\n\r\n", body);
}

// Writes what the socket takes at once: a peer being refused gets no more of the intake's time.
void SendNow(int fd, absl::string_view bytes) {
  [[maybe_unused]] ssize_t sent =
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

PeerAddress AddressOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  PeerAddress out;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    out.port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      ::inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    }
    out.port = ntohs(in6->sin6_port);
  }
  out.ip = text;
  return out;
}

PeerAddress LocalAddressOf(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return {};
  return AddressOf(addr);
}

int Bind(const std::string& host, int port, int& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int resolved =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (resolved != 0) {
    error = EADDRNOTAVAIL;
    return -1;
  }
  int fd = -1;
  error = EADDRNOTAVAIL;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int yes = 1;
    const int no = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
    // Every rank of a node registers at once at start-up (CACHEPD §1.2): a wide backlog.
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  return fd;
}

}  // namespace

std::string PeerAddress::ToString() const {
  return ip.find(':') == std::string::npos ? absl::StrCat(ip, ":", port)
                                           : absl::StrCat("[", ip, "]:", port);
}

absl::string_view RefusalKindName(RefusalKind kind) {
  switch (kind) {
    case RefusalKind::kDeadline:
      return "deadline";
    case RefusalKind::kHeadTooLarge:
      return "head_too_large";
    case RefusalKind::kBodyTooLarge:
      return "body_too_large";
    case RefusalKind::kMalformed:
      return "malformed";
    case RefusalKind::kConnectionLimit:
      return "connection_limit";
  }
  return "unknown";
}

struct RequestIntake::Connection {
  Connection(int fd_in, PeerAddress peer_in, Clock::time_point now, const IntakeOptions& options)
      : fd(fd_in),
        peer(std::move(peer_in)),
        accepted(now),
        deadline(now + options.request_deadline),
        framer(options.limits) {}

  int fd;  // -1 once closed or handed to a worker
  PeerAddress peer;
  Clock::time_point accepted;
  Clock::time_point deadline;
  std::string received;
  RequestFramer framer;
  bool continue_sent = false;
  bool draining = false;  // answered by the intake; its further bytes are dropped
};

RequestIntake::RequestIntake(IntakeOptions options, Answerer answer)
    : options_(std::move(options)), answer_(std::move(answer)) {}

RequestIntake::~RequestIntake() { Stop(); }

absl::Status RequestIntake::Start(const std::string& host, int port) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (started_) return absl::FailedPreconditionError("bootstrap server: started already");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bootstrap server: port ", port, " is outside 0..65535"));
  }
  int error = 0;
  listen_fd_ = Bind(host, port, error);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("bootstrap server: cannot listen on ", host, ":",
                                               port, " (", std::strerror(error), ")"));
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    error = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    return absl::UnavailableError(
        absl::StrCat("bootstrap server: eventfd failed (", std::strerror(error), ")"));
  }
  port_ = LocalAddressOf(listen_fd_).port;
  started_ = true;
  const size_t workers = std::max<size_t>(options_.worker_threads, 1);
  workers_.reserve(workers);
  for (size_t i = 0; i < workers; ++i) workers_.emplace_back([this] { RunWorker(); });
  intake_thread_ = std::thread([this] { RunIntake(); });
  return absl::OkStatus();
}

void RequestIntake::Stop() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (!intake_thread_.joinable()) return;
  stopping_ = true;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t written = ::write(wake_fd_, &one, sizeof(one));
  intake_thread_.join();
  {
    std::lock_guard<std::mutex> queue_lock(queue_mu_);
    workers_stop_ = true;
  }
  queue_cv_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
  ::close(wake_fd_);
  wake_fd_ = -1;
}

void RequestIntake::Report(RefusalKind kind, int http_status, const PeerAddress& peer,
                           const std::string& reason) const {
  if (!options_.on_refusal) return;
  RefusalEvent event;
  event.kind = kind;
  event.http_status = http_status;
  event.peer = peer;
  event.reason = reason;
  options_.on_refusal(event);
}

void RequestIntake::Close(Connection& c) {
  if (c.fd < 0) return;
  ::close(c.fd);
  c.fd = -1;
  --open_;
}

void RequestIntake::Refuse(Connection& c, RefusalKind kind, int http_status,
                           const std::string& reason) {
  Report(kind, http_status, c.peer, reason);  // first, so that it is out before the peer knows
  SendNow(c.fd, AnswerBytes(http_status, reason));
  // Half-close, then read and drop what the peer still sends, so that it reads the answer:
  // closing with unread bytes would reset the connection and could discard the answer.
  ::shutdown(c.fd, SHUT_WR);
  c.draining = true;
  c.received.clear();
  c.received.shrink_to_fit();
}

void RequestIntake::Service(Connection& c) {
  char buffer[kReadChunk];
  while (c.fd >= 0) {
    const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // the peer closed (or reset) before its request was whole
      Close(c);
      return;
    }
    if (c.draining) continue;
    c.received.append(buffer, static_cast<size_t>(n));
    const FrameVerdict verdict = c.framer.Scan(c.received);
    switch (verdict.state) {
      case FrameVerdict::State::kIncomplete:
        if (verdict.expects_continue && !c.continue_sent) {
          SendNow(c.fd, kContinue);
          c.continue_sent = true;
        }
        break;
      case FrameVerdict::State::kRefused: {
        const RefusalKind kind = verdict.http_status == 413   ? RefusalKind::kBodyTooLarge
                                 : verdict.http_status == 431 ? RefusalKind::kHeadTooLarge
                                                              : RefusalKind::kMalformed;
        Refuse(c, kind, verdict.http_status, verdict.reason);
        break;
      }
      case FrameVerdict::State::kComplete: {
        WholeRequest request;
        request.fd = c.fd;
        c.received.resize(verdict.request_bytes);  // a pipelined request after it goes unread
        request.bytes = std::move(c.received);
        request.peer = c.peer;
        request.local = LocalAddressOf(c.fd);
        request.continue_sent = c.continue_sent;
        request.answer_deadline = Clock::now() + options_.request_deadline;
        c.fd = -1;  // the worker's now; it closes through open_ too
        {
          std::lock_guard<std::mutex> lock(queue_mu_);
          queue_.push_back(std::move(request));
        }
        queue_cv_.notify_one();
        return;
      }
    }
  }
}

void RequestIntake::AcceptAll(std::vector<std::unique_ptr<Connection>>& connections,
                              Clock::time_point now) {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until_ = now + kAcceptPause;
      }
      return;  // EAGAIN: none left; anything else: tried again at the next wake
    }
    PeerAddress peer = AddressOf(addr);
    if (open_.load() >= std::max<size_t>(options_.max_connections, 1)) {
      // Make room by closing the longest-open connection the intake still holds: one already
      // answered (draining) first, else one still being read. A request that is whole is
      // never dropped for a newcomer.
      Connection* victim = nullptr;
      for (auto& c : connections) {
        if (c->fd < 0) continue;
        if (victim == nullptr || (c->draining && !victim->draining) ||
            (c->draining == victim->draining && c->accepted < victim->accepted)) {
          victim = c.get();
        }
      }
      if (victim == nullptr) {
        const std::string reason =
            absl::StrCat("connection: refused, all ", options_.max_connections,
                         " connections the bootstrap server keeps open are being answered "
                         "(--max-connections); try again");
        Report(RefusalKind::kConnectionLimit, 503, peer, reason);
        SendNow(fd, AnswerBytes(503, reason));
        ::close(fd);
        continue;
      }
      if (!victim->draining) {
        const std::string reason = absl::StrCat(
            "connection: closed before its request was whole, the longest open of the ",
            options_.max_connections,
            " connections the bootstrap server keeps (--max-connections), to admit a new one");
        Report(RefusalKind::kConnectionLimit, 503, victim->peer, reason);
        SendNow(victim->fd, AnswerBytes(503, reason));
      }
      Close(*victim);
    }
    ++open_;
    connections.push_back(std::make_unique<Connection>(fd, std::move(peer), now, options_));
  }
}

void RequestIntake::RunIntake() {
  std::vector<std::unique_ptr<Connection>> connections;
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    Clock::time_point now = Clock::now();
    const bool accepting = now >= accept_paused_until_;
    Clock::time_point wake_at = accepting ? Clock::time_point::max() : accept_paused_until_;
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // poll skips a negative fd
    for (const auto& c : connections) {
      fds.push_back({c->fd, POLLIN, 0});
      wake_at = std::min(wake_at, c->deadline);
    }
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max()) {
      const auto wait = std::chrono::ceil<milliseconds>(wake_at - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait, 0, 60000));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (stopping_.load()) break;
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t read = ::read(wake_fd_, &count, sizeof(count));
    }
    for (size_t i = 0; i < connections.size(); ++i) {
      if (fds[i + 2].revents != 0) Service(*connections[i]);
    }
    now = Clock::now();
    for (auto& c : connections) {
      if (c->fd < 0 || now < c->deadline) continue;
      if (!c->draining) {
        const std::string reason = absl::StrCat(
            "request: not whole ", options_.request_deadline.count(),
            " ms after its connection opened, the bootstrap server's deadline for reading one "
            "(--request-deadline); ",
            c->received.size(), " bytes had arrived");
        Report(RefusalKind::kDeadline, 408, c->peer, reason);
        SendNow(c->fd, AnswerBytes(408, reason));
      }
      Close(*c);
    }
    if (fds[1].revents != 0) AcceptAll(connections, now);
    connections.erase(std::remove_if(connections.begin(), connections.end(),
                                     [](const auto& c) { return c->fd < 0; }),
                      connections.end());
  }
  for (auto& c : connections) Close(*c);
  ::close(listen_fd_);
  listen_fd_ = -1;
}

void RequestIntake::RunWorker() {
  while (true) {
    WholeRequest request;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [this] { return !queue_.empty() || workers_stop_; });
      if (queue_.empty()) return;
      request = std::move(queue_.front());
      queue_.pop_front();
    }
    answer_(request);
    ::close(request.fd);
    --open_;
  }
}

}  // namespace kvrail::bootstrap
