#include "engine/transport/verbs/verbs_memory.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvrail::transport::verbs_internal {

std::string PackRkeys(const std::vector<ibv_mr*>& mrs) {
  std::string out;
  for (ibv_mr* mr : mrs) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>(mr->rkey >> shift));
  }
  return out;
}

absl::StatusOr<std::vector<uint32_t>> UnpackRkeys(const std::string& key, uint32_t rails,
                                                  const std::string& peer, int index) {
  if (key.size() % 4 != 0 || key.size() < 4 * rails || key.size() > 4 * 64) {
    return absl::InvalidArgumentError(absl::StrCat(peer, ": region ", index, " has a ", key.size(),
                                                   "-byte remote key; a verbs peer gives 4 "
                                                   "bytes per rail, and its lanes name ",
                                                   rails, " rails"));
  }
  std::vector<uint32_t> rkeys(key.size() / 4);
  for (uint32_t rail = 0; rail < rkeys.size(); ++rail) {
    for (int b = 0; b < 4; ++b) {
      rkeys[rail] |= uint32_t{static_cast<uint8_t>(key[4 * rail + b])} << (8 * b);
    }
  }
  return rkeys;
}

}  // namespace kvrail::transport::verbs_internal
