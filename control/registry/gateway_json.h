// Reading etcd's JSON gateway answers: int64 fields come as JSON strings ("revision":"12") and
// fields whose value is zero are left out; keys and values are base64.
#ifndef KVRAIL_CONTROL_REGISTRY_GATEWAY_JSON_H_
#define KVRAIL_CONTROL_REGISTRY_GATEWAY_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "control/registry/etcd_client.h"

namespace kvrail::registry {

// The int64 field `name` of `object`; 0 when absent or not a number.
int64_t GatewayInt64(const nlohmann::json& object, const char* name);

// A mvccpb.KeyValue: its key and value decoded. DataLoss for bad base64 or a value larger
// than kMaxValueBytes (the message names the key).
absl::StatusOr<KeyValue> ParseGatewayKeyValue(const nlohmann::json& kv);

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_GATEWAY_JSON_H_
