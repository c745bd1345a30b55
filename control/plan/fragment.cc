#include "control/plan/fragment.h"

namespace kvrail::plan {

bool operator==(const Fragment& a, const Fragment& b) {
  return a.group_id == b.group_id && a.field_id == b.field_id &&
         a.src_byte_offset == b.src_byte_offset && a.dst_byte_offset == b.dst_byte_offset &&
         a.src_row_stride_bytes == b.src_row_stride_bytes &&
         a.dst_row_stride_bytes == b.dst_row_stride_bytes && a.bytes_per_row == b.bytes_per_row &&
         a.rows_per_page == b.rows_per_page;
}

std::ostream& operator<<(std::ostream& os, const Fragment& fragment) {
  return os << "{group_id=" << fragment.group_id << " field_id=" << fragment.field_id
            << " src_byte_offset=" << fragment.src_byte_offset
            << " dst_byte_offset=" << fragment.dst_byte_offset
            << " src_row_stride_bytes=" << fragment.src_row_stride_bytes
            << " dst_row_stride_bytes=" << fragment.dst_row_stride_bytes
            << " bytes_per_row=" << fragment.bytes_per_row
            << " rows_per_page=" << fragment.rows_per_page << "}";
}

}  // namespace kvrail::plan
