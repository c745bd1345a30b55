#include "engine/transport/ucx/ucx_puts.h"

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/memory/prefault.h"
#include "engine/transport/landing_copy.h"
#include "engine/transport/ucx/ucx_lane.h"

namespace kvrail::transport::ucx_internal {

void MapRegions(PeerState& state) {
  const PeerLane& pl = state.lanes[0];
  for (size_t r = 0; r < pl.rkeys.size(); ++r) {
    void* local = nullptr;
    const uint64_t base = state.remote_bases[r];
    if (pl.rkeys[r] == nullptr || ucp_rkey_ptr(pl.rkeys[r], base, &local) != UCS_OK) continue;
    state.mapped[r] = 1;
    state.mapped_delta[r] = reinterpret_cast<intptr_t>(local) - static_cast<intptr_t>(base);
    state.prefault[r] =
        std::make_unique<Prefaulter>(static_cast<std::byte*>(local), state.remote_lengths[r]);
  }
}

std::byte* MappedAddress(const PeerState& state, int region, uint64_t address) {
  if (state.mapped[region] == 0) return nullptr;
  return reinterpret_cast<std::byte*>(static_cast<intptr_t>(address) + state.mapped_delta[region]);
}

void StoreSharedRows(Lane& lane, std::vector<Op*>& jobs, std::vector<Op*>* waiting) {
  if (lane.shared->am_writes || jobs.size() < 2) return;
  const PeerState* first_peer = nullptr;
  bool peers = false;  // batches of two peers at least
  for (const Op* op : jobs) {
    if (op->kind == OpKind::kConnect || op->kind == OpKind::kClose) return;
    if (op->kind != OpKind::kBatch) continue;
    if (first_peer == nullptr) first_peer = op->peer;
    peers = peers || op->peer != first_peer;
  }
  if (!peers) return;
  std::vector<StoredRows>& rows = lane.round_rows;
  std::vector<Lane::RoundBatch>& batches = lane.round_batches;
  rows.clear();
  batches.assign(jobs.size(), {});
  for (size_t b = 0; b < jobs.size(); ++b) {
    const Op* op = jobs[b];
    if (op->kind != OpKind::kBatch) continue;
    if (WhyUnsent(lane, *op) != Unsent::kNo) continue;
    const PeerState& state = *op->peer;
    for (size_t i = 0; i < op->writes.size(); ++i) {
      const Write& w = op->writes[i];
      if (w.rows < 2 || w.local_stride <= w.length) continue;
      std::byte* to = MappedAddress(state, op->region_of[i], w.remote_address);
      if (to == nullptr) continue;
      const std::byte* from = op->base + w.local_offset;
      rows.push_back({from, to, w.length, w.rows, w.local_stride, w.remote_stride,
                      static_cast<uint32_t>(b), static_cast<uint32_t>(i)});
      Lane::RoundBatch& batch = batches[b];
      const uintptr_t at = reinterpret_cast<uintptr_t>(from);
      if (!batch.shares || at < batch.first) batch.first = at;
      batch.shares = true;
    }
  }
  if (rows.size() < 2) return;
  std::vector<SharedRowRun>& runs = lane.round_runs;
  SharedRowRuns(rows, &runs);
  std::vector<LandingSlice>& slices = lane.round_slices;
  uint64_t stored = 0;
  for (const SharedRowRun& run : runs) {
    slices.clear();
    for (size_t k = run.begin; k < run.end; ++k) {
      const StoredRows& r = rows[k];
      Op* op = jobs[r.batch];
      const Write& w = op->writes[r.write];
      op->peer->prefault[op->region_of[r.write]]->Before(r.dst, RemoteSpan(w));
      slices.push_back({r.dst, r.dst_stride, r.src, r.length});
      if (op->stored_together.empty()) op->stored_together.assign(op->writes.size(), 0);
      op->stored_together[r.write] = 1;
    }
    LandingCopySharedRows(slices.data(), slices.size(), rows[run.begin].src_stride,
                          rows[run.begin].rows, lane.shared->landing_stores);
    stored += slices.size();
  }
  if (stored > 0) {
    LandingFence();
    lane.writes_stored_together.fetch_add(stored, std::memory_order_relaxed);
  }
  if (waiting == nullptr) return;
  // The batches that wait a round (above): none that shared, waited or has a job behind it.
  auto waits = [&](size_t b) {
    const Lane::RoundBatch& batch = batches[b];
    const Op* op = jobs[b];
    // A batch a shared pass stored from has its flags (Op::Reset empties them).
    if (!batch.shares || !op->stored_together.empty() || op->waited) return false;
    for (size_t later = b + 1; later < jobs.size(); ++later) {
      if (jobs[later]->peer == op->peer) return false;
    }
    for (size_t c = 0; c < jobs.size(); ++c) {
      const Lane::RoundBatch& other = batches[c];
      if (other.shares && jobs[c]->stored_together.empty() && jobs[c]->peer != op->peer &&
          jobs[c]->source == op->source && other.first < batch.first) {
        return true;
      }
    }
    return false;
  };
  size_t kept = 0;
  for (size_t b = 0; b < jobs.size(); ++b) {
    if (waits(b)) {
      jobs[b]->waited = true;
      waiting->push_back(jobs[b]);
    } else {
      jobs[kept++] = jobs[b];
    }
  }
  jobs.resize(kept);
}

void IssuePuts(Lane& lane, PeerLane& pl, Op* op) {
  PeerState& state = *op->peer;
  ucp_request_param_t param = RequestParam(op);
  const size_t count = op->writes.size();
  bool stored = false;
  const bool some_stored = !op->stored_together.empty();
  for (size_t i = 0; i < count; ++i) {
    if (some_stored && op->stored_together[i] != 0) continue;
    const Write& w = op->writes[i];
    // Into a region UCX maps here, a write is a plain store on this thread, as UCX's own put
    // into such memory would be, without a UCX call per write (a head-sliced room's rows are
    // a KiB each).
    // A strided write (a head-sliced page) is its rows, stored or put one by one from the one
    // description: nothing above expanded it.
    if (std::byte* to = MappedAddress(state, op->region_of[i], w.remote_address)) {
      state.prefault[op->region_of[i]]->Before(to, RemoteSpan(w));
      LandingCopyRows(to, w.remote_stride, op->base + w.local_offset, w.local_stride, w.length,
                      w.rows, lane.shared->landing_stores);
      stored = true;
      continue;
    }
    bool failed = false;
    for (uint64_t row = 0; row < w.rows && !failed; ++row) {
      ucs_status_ptr_t request =
          ucp_put_nbx(pl.ep, op->base + w.local_offset + row * w.local_stride, w.length,
                      w.remote_address + row * w.remote_stride, pl.rkeys[op->region_of[i]], &param);
      if (request == nullptr) continue;
      if (UCS_PTR_IS_ERR(request)) {
        op->status = PostFailure(
            request, absl::StrFormat("%s: write %d of %d: ucp_put_nbx",
                                     BatchContext(state.id, lane.index, op->source), i, count));
        failed = true;
        break;
      }
      ++op->requests;
    }
    if (failed) break;
  }
  // The stores are visible to the peer before anything this lane does next (a flush's answer,
  // the caller's status message) can be.
  if (stored) LandingFence();
}

}  // namespace kvrail::transport::ucx_internal
