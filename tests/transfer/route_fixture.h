// The routes the multi-process transfer tests move: a GQA cache (8 KV heads of 128 dims, bf16,
// 16-token pages) whose decode side holds 256 MiB at TP 1, head-sliced between prefill TP P and
// decode TP D (CACHEPD §6.3). Both the node processes and the verifying test compute the same
// copies from the same setup.
#ifndef KVRAIL_TESTS_TRANSFER_ROUTE_FIXTURE_H_
#define KVRAIL_TESTS_TRANSFER_ROUTE_FIXTURE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"

namespace kvrail::testing {

struct RouteSetup {
  // 8 layers x (k, v) x 512 pages x 32 KiB = 256 MiB at TP 1 (511 usable pages + the null one).
  layout::KvShape shape = [] {
    layout::KvShape s;
    s.layers = 8;
    s.kv_heads = 8;
    s.head_dim = 128;
    s.page_tokens = 16;
    s.pages = 511;
    return s;
  }();
  int prefill_tp = 1;
  int decode_tp = 1;
  // Pages in the room: source pages 1..n, destination pages in reverse from the last, so
  // destination pages 1..(pages - n) and the null page stay untouched.
  int room_pages = 480;
  // A head-sliced page's rows as one strided copy (Copy::rows), as a prefill sidecar sends them
  // by default; false: a copy per row, as with its --no-strided-copies.
  bool strided_copies = true;
};

absl::StatusOr<layout::Contract> ContractFor(const RouteSetup& setup, int tp_size);
// The coalesced copies prefill rank `p` writes into decode rank `d` for one room (strided or a
// copy per row, as setup.strided_copies says); empty when p does not send to d.
absl::StatusOr<CopyList> RoomCopies(const RouteSetup& setup, int p, int d);
// The pattern seed of prefill rank p's arena.
inline uint64_t PrefillSeed(int p) { return 1000 + static_cast<uint64_t>(p); }

}  // namespace kvrail::testing

#endif  // KVRAIL_TESTS_TRANSFER_ROUTE_FIXTURE_H_
