#include "engine/transport/region_table.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace kvrail::transport {

absl::Status RegionNotRegistered(RegionId region) {
  return absl::NotFoundError(absl::StrFormat("Deregister: region %d is not registered", region));
}

}  // namespace kvrail::transport
