#include "control/wire/dispatch.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvrail::wire {
namespace {

TEST(ClassifyTest, NoFrameIsDropped) { EXPECT_EQ(Classify({}), MessageKind::kDropped); }

TEST(ClassifyTest, NonAsciiFrameZeroIsDropped) {
  EXPECT_EQ(Classify(std::vector<std::string>{"\xe2\x82\xac", "x"}), MessageKind::kDropped);
  EXPECT_EQ(Classify(std::vector<std::string>{"None\x80"}), MessageKind::kDropped);
}

TEST(ClassifyTest, NoneMarkerIsRegistrationWhateverTheFrameCount) {
  EXPECT_EQ(Classify(std::vector<std::string>{"None"}), MessageKind::kRegistration);
  EXPECT_EQ(Classify(std::vector<std::string>(9, "None")), MessageKind::kRegistration);
}

TEST(ClassifyTest, AnyOtherAsciiFrameZeroIsPreallocation) {
  for (const char* first : {"none", "NONE", "None ", "", "42", "Non"}) {
    EXPECT_EQ(Classify(std::vector<std::string>{first, "s", ""}), MessageKind::kPreallocation)
        << first;
  }
}

}  // namespace
}  // namespace kvrail::wire
