#include "control/registry/gateway_json.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvrail::registry {

int64_t GatewayInt64(const nlohmann::json& object, const char* name) {
  if (!object.is_object()) return 0;
  auto it = object.find(name);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  int64_t value = 0;
  if (it->is_string() && absl::SimpleAtoi(it->get<std::string>(), &value)) return value;
  return 0;
}

absl::StatusOr<KeyValue> ParseGatewayKeyValue(const nlohmann::json& kv) {
  KeyValue out;
  if (!kv.is_object()) return absl::DataLossError("a key-value that is not a JSON object");
  const auto text = [&](const char* name) {
    auto it = kv.find(name);
    return it != kv.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!absl::Base64Unescape(text("key"), &out.key)) {
    return absl::DataLossError("a key that is not base64");
  }
  if (!absl::Base64Unescape(text("value"), &out.value)) {
    return absl::DataLossError(absl::StrCat("the value of ", out.key, " is not base64"));
  }
  if (out.value.size() > kMaxValueBytes) {
    return absl::DataLossError(absl::StrCat("the value of ", out.key, " has ", out.value.size(),
                                            " bytes, more than ", kMaxValueBytes));
  }
  out.mod_revision = GatewayInt64(kv, "mod_revision");
  out.version = GatewayInt64(kv, "version");
  out.lease = GatewayInt64(kv, "lease");
  return out;
}

}  // namespace kvrail::registry
