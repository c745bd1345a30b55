#include "control/layout/small_room.h"

#include <utility>

#include "control/layout/kv_shape.h"

namespace kvrail::layout::testing {

Contract SmallContract() {
  KvShape shape;
  shape.layers = 2;
  shape.pages = 16;
  return BuildKvContract(shape, 1).value();
}

Manifest RoomManifest(const Contract& contract, std::vector<int64_t> blocks) {
  const int64_t prompt = static_cast<int64_t>(blocks.size()) * 16;
  const std::vector<std::vector<int64_t>> table = {std::move(blocks)};
  return BuildManifest(contract, table, 0, prompt).value();
}

}  // namespace kvrail::layout::testing
