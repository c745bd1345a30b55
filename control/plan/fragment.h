// A fragment (CACHEPD §6.3): which byte range of each page row of one field a prefill rank
// copies to which offset of the decode rank's page of the same field. The planner emits
// fragments once per registration; the address resolver applies each one to every pair of
// (source page, destination page) of a room. Fragments never go on the wire.
#ifndef KVRAIL_CONTROL_PLAN_FRAGMENT_H_
#define KVRAIL_CONTROL_PLAN_FRAGMENT_H_

#include <cstdint>
#include <ostream>
#include <string>

namespace kvrail::plan {

// For one page pair (s, t) of field `field_id` the fragment copies, for row in
// 0..rows_per_page-1,
//   bytes_per_row bytes from  page s + src_byte_offset + row * src_row_stride_bytes
//                      to    page t + dst_byte_offset + row * dst_row_stride_bytes.
// Offsets are relative to the start of the field's page on each side (§6.9 adds the arena
// base, the field's page-zero offset and the page stride).
struct Fragment {
  std::string group_id;
  std::string field_id;
  int64_t src_byte_offset = 0;
  int64_t dst_byte_offset = 0;
  int64_t src_row_stride_bytes = 0;
  int64_t dst_row_stride_bytes = 0;
  int64_t bytes_per_row = 0;
  int64_t rows_per_page = 0;
};

// Member-wise equality: two fragments are equal when they copy the same bytes.
bool operator==(const Fragment& a, const Fragment& b);
inline bool operator!=(const Fragment& a, const Fragment& b) { return !(a == b); }

// One line, member by member, for test failures and logs.
std::ostream& operator<<(std::ostream& os, const Fragment& fragment);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_FRAGMENT_H_
