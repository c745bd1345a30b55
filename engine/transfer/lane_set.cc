#include "engine/transfer/lane_set.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvrail::transfer {

std::string LaneSet::Describe(int lanes) const {
  if (Every()) return "every lane";
  if (CountIn(lanes) == 0) return absl::StrCat("no lane of ", lanes);
  std::vector<int> held;
  for (int lane = first; lane < lanes; lane += step) held.push_back(lane);
  return absl::StrCat(held.size() == 1 ? "lane " : "lanes ", absl::StrJoin(held, ", "), " of ",
                      lanes);
}

bool operator==(const LaneSet& a, const LaneSet& b) {
  return a.first == b.first && a.step == b.step;
}

LaneSet WriterLanes(int lanes, int writers, int writer) {
  if (writers <= 1 || writers > lanes || writer < 0) return LaneSet{};
  return LaneSet{.first = writer % writers, .step = writers};
}

}  // namespace kvrail::transfer
