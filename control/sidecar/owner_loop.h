// The one thread that owns a sidecar's room state (issue 29: "one owner thread for room state";
// docs/ARCHITECTURE.md, "Threads"). Every other thread -- the engine API's, the CachePD inbox's,
// the ticker, the strands, the data plane's completions -- hands it work instead of taking a
// lock: Post for what needs no answer (a completion, a peer frame), Call for what its caller
// must answer with (an engine request's reply). Work runs one job at a time, in the order it
// was posted, so the state it touches needs no lock and no job sees another half done. A
// sidecar drives it from its engine API's thread (Driven); the thread of its own is for tests
// and tools that have no poller.
//
// Nothing slow may run on it: a job that must wait on a peer, a socket or the data plane posts
// that part to a strand and posts its result back. A job may Post more work (it runs after the
// jobs already queued); a Call made from the owner thread itself runs at once, in place, since
// waiting for itself would never end.
//
// Thread-safe. Stop runs every job already posted, then joins the thread; later Posts are
// dropped and later Calls answer nullopt (the sidecar is stopping: nothing owns its state).
#ifndef KVRAIL_CONTROL_SIDECAR_OWNER_LOOP_H_
#define KVRAIL_CONTROL_SIDECAR_OWNER_LOOP_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "engine/sync/mutex.h"

namespace kvrail::sidecar {

class OwnerLoop {
 public:
  // Starts the thread, named `name` (at most 15 characters are kept: top -H, perf, gdb).
  explicit OwnerLoop(const std::string& name);

  // Starts no thread: a thread that already polls (a sidecar's engine API) drives the loop. It
  // calls Adopt once, before any job, to become the owner; polls wake_fd(), readable while
  // jobs wait; and calls RunPending when it is. Stop then marks the loop stopping (later Posts
  // from other threads are dropped), and the driver's last RunPending runs what is left.
  struct Driven {};
  explicit OwnerLoop(Driven);
  int wake_fd() const { return wake_fd_; }
  void Adopt();
  // On the driving thread: runs the jobs posted until none is left (those they post too).
  void RunPending() ABSL_LOCKS_EXCLUDED(mu_);
  ~OwnerLoop();  // Stop()
  OwnerLoop(const OwnerLoop&) = delete;
  OwnerLoop& operator=(const OwnerLoop&) = delete;

  // Runs `job` on the owner thread after every job posted before it. False (and `job` is
  // dropped) once Stop has begun.
  bool Post(std::function<void()> job) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `fn` on the owner thread and returns what it returned; nullopt if the loop stopped
  // before it ran. From the owner thread itself, runs `fn` at once.
  template <typename Fn, typename R = std::invoke_result_t<Fn&>>
  std::optional<std::conditional_t<std::is_void_v<R>, std::monostate, R>> Call(Fn fn);

  // Whether the calling thread is the owner thread.
  bool OnOwner() const { return std::this_thread::get_id() == owner_id_.load(); }

  // Runs the jobs already posted (and those they post), then joins the thread. Idempotent;
  // never call it from the owner thread. Driven: marks the loop stopping (RunPending above).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs posted and not yet begun.
  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  mutable Mutex mu_;
  std::condition_variable work_;  // a job was posted, or Stop began
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::atomic<std::thread::id> owner_id_{};  // written before the owner runs any job
  int wake_fd_ = -1;                         // driven: an eventfd, written when jobs_ fills
};

template <typename Fn, typename R>
std::optional<std::conditional_t<std::is_void_v<R>, std::monostate, R>> OwnerLoop::Call(Fn fn) {
  using Out = std::conditional_t<std::is_void_v<R>, std::monostate, R>;
  if (OnOwner()) {
    if constexpr (std::is_void_v<R>) {
      fn();
      return Out{};
    } else {
      return fn();
    }
  }
  auto promise = std::make_shared<std::promise<Out>>();
  std::future<Out> answer = promise->get_future();
  const bool posted = Post([promise, fn = std::move(fn)]() mutable {
    if constexpr (std::is_void_v<R>) {
      fn();
      promise->set_value(Out{});
    } else {
      promise->set_value(fn());
    }
  });
  if (!posted) return std::nullopt;
  return answer.get();
}

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_OWNER_LOOP_H_
