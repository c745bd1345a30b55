// Writes that read slices of the same source rows, found among the writes a lane stores in one
// round, so that each source row is read once for all of them (decision 0020). A prefill rank of
// the smaller TP (1:2, 2:4) sends each decode rank its heads of every token row: one strided write
// per decode rank over the same rows, each slice `length` bytes of a row `src_stride` long. Stored
// one write after another, every pass reads every row and its cache lines drag the other slices'
// bytes in too (0.66 of a whole copy's rate on the host of 2026-12-07); stored a source row at a
// time (LandingCopySharedRows), the rows are read once, front to back (0.95).
//
// Pure: no memory is touched, only addresses compared.
#ifndef KVRAIL_ENGINE_TRANSPORT_SHARED_ROWS_H_
#define KVRAIL_ENGINE_TRANSPORT_SHARED_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvrail::transport {

// A write a lane stores itself (into memory mapped here), as SharedRowRuns sees it.
struct StoredRows {
  const std::byte* src = nullptr;  // its first row's slice
  std::byte* dst = nullptr;        // where that row lands
  uint64_t length = 0;             // a slice's bytes
  uint64_t rows = 0;
  uint64_t src_stride = 0;
  uint64_t dst_stride = 0;
  // The caller's, carried along: which of its batches and which of that batch's writes.
  uint32_t batch = 0;
  uint32_t write = 0;
};

// One shared pass: writes [begin, end) of the sorted list.
struct SharedRowRun {
  size_t begin = 0;
  size_t end = 0;
};

// Sorts `writes` by source stride, rows and source address, and puts into `runs` (cleared first;
// its capacity kept, so that a lane's round does not allocate) the runs of at least two writes
// that read slices of the same rows: equal `rows` (more than one) and `src_stride`, each
// slice starting where the one before it ends, all of them inside the first one's row (the last
// slice ends at most `src_stride` past the first one's start). Such writes may be stored a row at
// a time, in the run's order. Writes in no run are left as they are. The rows of a run's writes
// land in another order than one write after another would store them, which only writes whose
// destinations overlap could tell; writes posted together carry no order among themselves.
void SharedRowRuns(std::vector<StoredRows>& writes, std::vector<SharedRowRun>* runs);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_SHARED_ROWS_H_
