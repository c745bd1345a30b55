#include "control/plan/fragment.h"

#include <gtest/gtest.h>

#include <sstream>

namespace kvrail::plan {
namespace {

Fragment Sample() { return Fragment{"history", "layer.0.k", 8, 0, 16, 8, 8, 2}; }

TEST(FragmentTest, EqualWhenEveryMemberIsEqual) {
  EXPECT_EQ(Sample(), Sample());
  Fragment other = Sample();
  other.rows_per_page = 1;
  EXPECT_NE(Sample(), other);
  other = Sample();
  other.field_id = "layer.0.v";
  EXPECT_NE(Sample(), other);
  other = Sample();
  other.dst_byte_offset = 8;
  EXPECT_NE(Sample(), other);
}

TEST(FragmentTest, PrintsEveryMember) {
  std::ostringstream text;
  text << Sample();
  EXPECT_EQ(text.str(),
            "{group_id=history field_id=layer.0.k src_byte_offset=8 dst_byte_offset=0 "
            "src_row_stride_bytes=16 dst_row_stride_bytes=8 bytes_per_row=8 rows_per_page=2}");
}

}  // namespace
}  // namespace kvrail::plan
