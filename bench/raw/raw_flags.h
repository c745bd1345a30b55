// The flags of `kvrail bench raw`: byte sizes with binary suffixes, the block-size, batch-size
// and link lists, each parsed strictly. Every rejection names the flag, the value and the
// rule it broke, in one line.
#ifndef KVRAIL_BENCH_RAW_RAW_FLAGS_H_
#define KVRAIL_BENCH_RAW_RAW_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::bench {

// Where the two processes of a measurement meet.
enum class RawLink {
  kTcp,    // UCX tcp on the loopback interface ("lo")
  kShm,    // UCX shared memory ("sm,self")
  kNetns,  // UCX tcp between two network namespaces joined by a veth pair (needs root)
  // The raw verbs backend (engine/transport/verbs), provider from KVRAIL_VERBS_PROVIDER
  // (libibverbs: an RDMA NIC; softverbs: the software provider, a functional run only, never a
  // bandwidth figure).
  kVerbs,
};

// "tcp", "shm", "netns", "verbs".
const char* RawLinkName(RawLink link);

// The largest block a row may write (the 4 KiB .. 64 MiB range, and no more).
inline constexpr uint64_t kMaxBlockBytes = uint64_t{64} << 20;
// The largest batch a row may post (the 1 .. 1024 range).
inline constexpr int kMaxBatch = 1024;

// Parses one byte size: decimal digits with an optional suffix B, KiB, MiB or GiB (powers of
// 1024, case as written), e.g. "4096", "64KiB", "1MiB". Decimal suffixes (KB, MB, K, M) are
// rejected as ambiguous. InvalidArgument naming `flag` otherwise; the result is > 0.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view flag, absl::string_view text);

// "4 KiB", "64 MiB", "1536 B": the largest binary unit that divides `bytes` exactly.
std::string FormatBytes(uint64_t bytes);

// A comma-separated list of byte sizes, each within [1 B, 64 MiB]; duplicates are dropped and
// the order kept. InvalidArgument for an empty list or entry, or a size out of range.
absl::StatusOr<std::vector<uint64_t>> ParseBlockSizes(absl::string_view flag,
                                                      absl::string_view text);

// A comma-separated list of batch sizes, each an integer within [1, 1024]; duplicates dropped.
absl::StatusOr<std::vector<int>> ParseBatchSizes(absl::string_view flag, absl::string_view text);

// Each value a comma-separated list of "tcp", "shm", "netns", "verbs" (the flag may repeat);
// duplicates dropped, order kept. InvalidArgument for an empty list or an unknown name.
absl::StatusOr<std::vector<RawLink>> ParseLinks(absl::string_view flag,
                                                const std::vector<std::string>& values);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_RAW_FLAGS_H_
