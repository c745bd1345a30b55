#include "bench/raw/write_window.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "engine/base/copy_list.h"
#include "engine/base/copy_source.h"
#include "engine/transfer/scheduler.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Transfer ids are unique in the process: a scheduler may serve several windows, and a window
// that gave up may leave transfers behind.
std::atomic<uint64_t> next_transfer_id{1};

// A transfer's block writes, produced as the scheduler pulls them: write k goes from source offset
// source + (k % slots) * block to destination + the same. Its envelope is the whole working set
// on both sides.
class BlockSource : public CopySource {
 public:
  BlockSource(uint64_t first, uint64_t blocks, uint64_t slots, uint64_t block, uint64_t source,
              uint64_t destination)
      : next_(first),
        end_(first + blocks),
        blocks_(blocks),
        slots_(slots),
        block_(block),
        source_(source),
        destination_(destination) {}
  CopyEnvelope envelope() const override {
    const uint64_t span = slots_ * block_;
    return {source_, source_ + span, destination_, destination_ + span, blocks_ * block_, blocks_};
  }
  size_t Next(Copy* out, size_t capacity) override {
    size_t n = 0;
    for (; n < capacity && next_ < end_; ++n, ++next_) {
      const uint64_t at = (next_ % slots_) * block_;
      out[n] = Copy{source_ + at, destination_ + at, block_};
    }
    return n;
  }

 private:
  uint64_t next_;
  const uint64_t end_, blocks_, slots_, block_, source_, destination_;
};

// The window's transfers: the outcomes (on the lane thread that landed the transfer) submit the
// next transfers and count what landed. Shared with every transfer's completion, so a window that
// gave up is kept until its last outcome.
class Window : public std::enable_shared_from_this<Window> {
 public:
  Window(transfer::Scheduler& scheduler, const WindowTarget& target, const WindowSpec& spec)
      : scheduler_(scheduler),
        target_(target),
        spec_(spec),
        slots_(std::max<uint64_t>(1, spec.working_set / spec.block_bytes)),
        blocks_per_transfer_(static_cast<uint64_t>(std::clamp<uint64_t>(
            spec.max_transfer_bytes / spec.block_bytes, 1, static_cast<uint64_t>(spec.batch)))),
        max_blocks_(spec.max_bytes == 0
                        ? UINT64_MAX
                        : (spec.max_bytes + spec.block_bytes - 1) / spec.block_bytes),
        transfers_in_flight_(static_cast<int>(std::min<uint64_t>(
            static_cast<uint64_t>(TransfersInFlight(spec)),
            std::max<uint64_t>(1, spec.destination_span / (slots_ * spec.block_bytes))))) {
    // Copy 0 is taken first, and most often: the sample checked after the window is there.
    for (int c = transfers_in_flight_ - 1; c >= 0; --c) free_copies_.push_back(c);
  }

  absl::StatusOr<WindowResult> Run() {
    start_ = Clock::now();
    deadline_ = start_ + absl::ToChronoNanoseconds(spec_.duration);
    Pump();
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_.wait_for(lock, absl::ToChronoNanoseconds(spec_.patience),
                        [this] { return finished_; })) {
      stopped_ = true;
      const std::set<uint64_t> in_flight = in_flight_;
      lock.unlock();
      for (uint64_t id : in_flight) (void)scheduler_.Cancel(id, "the bench window gave up");
      return absl::DeadlineExceededError(absl::StrFormat(
          "window of %u-byte writes, batch %d: %d transfers had no outcome within %s",
          spec_.block_bytes, spec_.batch, in_flight.size(), absl::FormatDuration(spec_.patience)));
    }
    if (!error_.ok()) return error_;
    result_.elapsed = absl::FromChrono(end_ - start_);
    return result_;
  }

 private:
  // Submits transfers while the window is open and fewer than transfers_in_flight_ are in flight;
  // ends the window once none is in flight and no more may start. The transfers are built and
  // submitted outside the lock.
  void Pump() {
    while (true) {
      uint64_t first_block = 0;
      uint64_t blocks = 0;
      uint64_t id = 0;
      uint64_t copy = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        const bool open = !stopped_ && next_block_ < max_blocks_ && Clock::now() < deadline_;
        if (!open || in_flight_.size() >= static_cast<size_t>(transfers_in_flight_)) {
          if (in_flight_.empty() && !finished_) {
            finished_ = true;
            done_.notify_all();
          }
          return;
        }
        // A transfer never crosses a batch: a batch's last transfer carries what is left of it.
        const uint64_t batch = static_cast<uint64_t>(spec_.batch);
        const uint64_t left_in_batch = batch - next_block_ % batch;
        first_block = next_block_;
        blocks = std::min({blocks_per_transfer_, left_in_batch, max_blocks_ - next_block_});
        next_block_ += blocks;
        id = next_transfer_id.fetch_add(1, std::memory_order_relaxed);
        in_flight_.insert(id);
        copy = free_copies_.back();  // one per transfer in flight: never empty here
        free_copies_.pop_back();
      }
      absl::Status submitted = scheduler_.Submit(MakeTransfer(id, first_block, blocks, copy));
      if (!submitted.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        in_flight_.erase(id);
        free_copies_.push_back(copy);
        FailLocked(std::move(submitted));
      }
    }
  }

  transfer::Transfer MakeTransfer(uint64_t id, uint64_t first_block, uint64_t blocks,
                                  uint64_t copy) {
    transfer::Transfer transfer{.transfer_id = id,
                                .peer = target_.peer,
                                .source = target_.source,
                                .source_length = target_.source_length,
                                .remote = target_.remote,
                                .remote_base = target_.remote_base,
                                .remote_length = target_.remote_length};
    // Streamed, as the prefill sidecar submits its transfers (engine/base/copy_source.h).
    transfer.stream = std::make_unique<BlockSource>(
        first_block, blocks, slots_, spec_.block_bytes, spec_.source_offset,
        spec_.destination_offset + copy * slots_ * spec_.block_bytes);
    transfer.done = [self = shared_from_this(), blocks,
                     copy](const transfer::TransferOutcome& outcome) {
      self->OnOutcome(outcome, blocks, copy);
    };
    return transfer;
  }

  void OnOutcome(const transfer::TransferOutcome& outcome, uint64_t blocks, uint64_t copy) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(outcome.transfer_id);
      free_copies_.push_back(copy);
      if (outcome.status.ok()) {
        result_.bytes += outcome.stats.bytes;
        result_.blocks += blocks;
        ++result_.transfers;
        result_.writes += outcome.stats.writes;
        result_.posts += outcome.stats.batches;
        result_.flushes += outcome.stats.lanes_used;
        end_ = Clock::now();
      } else {
        FailLocked(outcome.status);
      }
    }
    Pump();
  }

  // The window's first failure; no transfer starts after it.
  void FailLocked(absl::Status status) {
    if (error_.ok()) error_ = std::move(status);
    stopped_ = true;
  }

  transfer::Scheduler& scheduler_;
  const WindowTarget target_;
  const WindowSpec spec_;
  const uint64_t slots_;
  const uint64_t blocks_per_transfer_;
  const uint64_t max_blocks_;  // blocks to submit (max_bytes); UINT64_MAX: until the deadline
  const int transfers_in_flight_;
  Clock::time_point start_;     // written by Run before the first Submit
  Clock::time_point deadline_;  // likewise

  std::mutex mu_;  // never held across a call to the scheduler
  std::condition_variable done_;
  // Guarded by mu_:
  std::set<uint64_t> in_flight_;       // transfer ids submitted, outcome not yet delivered
  std::vector<uint64_t> free_copies_;  // copies of the working set no transfer in flight writes
  uint64_t next_block_ = 0;            // the window's next block write, counting from 0
  bool stopped_ = false;               // a transfer failed, or Run gave up
  bool finished_ = false;
  absl::Status error_;
  WindowResult result_;
  Clock::time_point end_;
};

}  // namespace

double WindowResult::gbps() const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

double WindowResult::blocks_per_s(uint64_t block_bytes) const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 && block_bytes > 0
             ? static_cast<double>(bytes) / static_cast<double>(block_bytes) / seconds
             : 0;
}

int TransfersInFlight(const WindowSpec& spec) {
  if (spec.block_bytes == 0 || spec.batch < 1) return 2;
  const uint64_t transfer_bytes = std::clamp<uint64_t>(spec.max_transfer_bytes / spec.block_bytes,
                                                       1, static_cast<uint64_t>(spec.batch)) *
                                  spec.block_bytes;
  const uint64_t wanted = (spec.inflight_bytes + transfer_bytes - 1) / transfer_bytes;
  return static_cast<int>(
      std::clamp<uint64_t>(wanted, 2, static_cast<uint64_t>(std::max(2, spec.max_transfers))));
}

absl::StatusOr<WindowResult> RunWriteWindow(transfer::Scheduler& scheduler,
                                            const WindowTarget& target, const WindowSpec& spec) {
  if (spec.block_bytes == 0 || spec.batch < 1 || spec.inflight_bytes == 0 ||
      spec.max_transfers < 1 || spec.max_transfer_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window: block %u B, batch %d, %u B in flight, %d transfers and transfers "
                        "of %u B: each must be "
                        "at least 1",
                        spec.block_bytes, spec.batch, spec.inflight_bytes, spec.max_transfers,
                        spec.max_transfer_bytes));
  }
  if (spec.working_set < spec.block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window: working set %u B is smaller than one block (%u B)",
                        spec.working_set, spec.block_bytes));
  }
  if (target.remote == nullptr) {
    return absl::InvalidArgumentError("window: the target's regions (its descriptor) are missing");
  }
  auto window = std::make_shared<Window>(scheduler, target, spec);
  // The window lives on in its transfers' completions until the last outcome.
  return window->Run();
}

}  // namespace kvrail::bench
