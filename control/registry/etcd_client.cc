#include "control/registry/etcd_client.h"

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "control/registry/gateway_json.h"

namespace kvrail::registry {
namespace {

using nlohmann::json;

}  // namespace

absl::StatusOr<std::string> ParseRegistryUrl(absl::string_view url) {
  const auto bad = [&](absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("--registry ", url, ": ", rule, " (expected etcd://host:port)"));
  };
  if (!absl::ConsumePrefix(&url, "etcd://")) return bad("the scheme must be etcd://");
  const size_t colon = url.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return bad("it needs a host and a port");
  int port = 0;
  const absl::string_view port_text = url.substr(colon + 1);
  if (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535 ||
      port_text != absl::StrCat(port)) {
    return bad("the port must be a decimal number in [1, 65535]");
  }
  for (char c : url.substr(0, colon)) {
    if (!(absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_' || c == '[' || c == ']' ||
          c == ':')) {
      return bad("the host may hold only letters, digits, '.', '-', '_' and IPv6 brackets");
    }
  }
  return std::string(url);
}

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xFF) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::string endpoint, absl::Duration timeout)
    : endpoint_(std::move(endpoint)),
      http_(std::make_unique<httplib::Client>(absl::StrCat("http://", endpoint_))) {
  const int64_t us = absl::ToInt64Microseconds(timeout);
  http_->set_connection_timeout(us / 1000000, us % 1000000);
  http_->set_read_timeout(us / 1000000, us % 1000000);
  http_->set_write_timeout(us / 1000000, us % 1000000);
  http_->set_keep_alive(true);
}

EtcdClient::~EtcdClient() = default;

absl::Status EtcdClient::Health() {
  auto result = http_->Get("/health");
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", endpoint_, ": GET /health: ", httplib::to_string(result.error())));
  }
  if (result->status != 200 || !absl::StrContains(result->body, "\"true\"")) {
    return absl::UnavailableError(absl::StrCat("etcd at ", endpoint_, ": GET /health answered ",
                                               result->status, ": ", result->body.substr(0, 200)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EtcdClient::Call(absl::string_view call, const std::string& path,
                                             const std::string& body) {
  // The gateway ends an error answer with an HTTP trailer (Grpc-Trailer-Content-Type), which
  // cpp-httplib 0.11 cannot read: it reports Error::Read after the whole body arrived. So the
  // status and body are taken as they come, and a Read error after a complete JSON body counts
  // as the answer.
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body;
  request.set_header("Content-Type", "application/json");
  int status = 0;
  std::string answer_text;
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
    answer_text.append(data, length);
    return answer_text.size() <= 2 * kMaxValueBytes + (kMaxRangeKeys << 8);
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent = http_->send(request, response, error);
  json answer = json::parse(answer_text, nullptr, /*allow_exceptions=*/false);
  if (!sent && (status == 0 || !answer.is_object())) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", endpoint_, ": ", call, ": ", httplib::to_string(error)));
  }
  if (status != 200) {
    std::string message = answer_text.substr(0, 300);
    if (answer.is_object() && answer.contains("message") && answer["message"].is_string()) {
      message = answer["message"].get<std::string>();
    }
    const std::string text =
        absl::StrCat("etcd at ", endpoint_, ": ", call, " answered ", status, ": ", message);
    // gRPC code 5 is NOT_FOUND (a lease that expired).
    if (answer.is_object() && GatewayInt64(answer, "code") == 5) return absl::NotFoundError(text);
    if (status >= 500) return absl::UnavailableError(text);
    return absl::FailedPreconditionError(text);
  }
  return answer_text;
}

namespace {
absl::StatusOr<json> ParseAnswer(const std::string& endpoint, absl::string_view call,
                                 const std::string& body) {
  json answer = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object()) {
    return absl::DataLossError(
        absl::StrCat("etcd at ", endpoint, ": ", call, " answered with something not JSON"));
  }
  return answer;
}
}  // namespace

absl::StatusOr<int64_t> EtcdClient::Put(absl::string_view key, absl::string_view value,
                                        int64_t lease) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd put ", key, ": the value has ", value.size(), " bytes, more than ", kMaxValueBytes));
  }
  json request = {{"key", absl::Base64Escape(key)}, {"value", absl::Base64Escape(value)}};
  if (lease != 0) request["lease"] = absl::StrCat(lease);
  const std::string call = absl::StrCat("put ", key);
  auto body = Call(call, "/v3/kv/put", request.dump());
  if (!body.ok()) return body.status();
  auto answer = ParseAnswer(endpoint_, call, *body);
  if (!answer.ok()) return answer.status();
  return GatewayInt64((*answer)["header"], "revision");
}

absl::Status EtcdClient::Compact(int64_t revision) {
  const std::string call = absl::StrCat("compaction at revision ", revision);
  json request = {{"revision", absl::StrCat(revision)}, {"physical", true}};
  return Call(call, "/v3/kv/compaction", request.dump()).status();
}

absl::StatusOr<std::optional<KeyValue>> EtcdClient::Get(absl::string_view key) {
  const std::string call = absl::StrCat("range ", key);
  auto body = Call(call, "/v3/kv/range", json{{"key", absl::Base64Escape(key)}}.dump());
  if (!body.ok()) return body.status();
  auto answer = ParseAnswer(endpoint_, call, *body);
  if (!answer.ok()) return answer.status();
  auto kvs = answer->find("kvs");
  if (kvs == answer->end() || !kvs->is_array() || kvs->empty()) return std::nullopt;
  auto kv = ParseGatewayKeyValue((*kvs)[0]);
  if (!kv.ok()) {
    return absl::DataLossError(
        absl::StrCat("etcd at ", endpoint_, ": ", call, ": ", kv.status().message()));
  }
  return std::optional<KeyValue>(std::move(*kv));
}

absl::StatusOr<std::vector<KeyValue>> EtcdClient::List(absl::string_view prefix,
                                                       int64_t* revision) {
  const std::string call = absl::StrCat("range ", prefix, "*");
  json request = {{"key", absl::Base64Escape(prefix)},
                  {"range_end", absl::Base64Escape(PrefixEnd(prefix))},
                  {"limit", absl::StrCat(kMaxRangeKeys)}};
  auto body = Call(call, "/v3/kv/range", request.dump());
  if (!body.ok()) return body.status();
  auto answer = ParseAnswer(endpoint_, call, *body);
  if (!answer.ok()) return answer.status();
  if (revision != nullptr) *revision = GatewayInt64((*answer)["header"], "revision");
  std::vector<KeyValue> out;
  auto kvs = answer->find("kvs");
  if (kvs == answer->end() || !kvs->is_array()) return out;
  for (const json& item : *kvs) {
    auto kv = ParseGatewayKeyValue(item);
    if (!kv.ok()) {
      return absl::DataLossError(
          absl::StrCat("etcd at ", endpoint_, ": ", call, ": ", kv.status().message()));
    }
    out.push_back(std::move(*kv));
  }
  return out;
}

absl::StatusOr<int64_t> EtcdClient::Delete(absl::string_view key, bool prefix) {
  const std::string call = absl::StrCat("deleterange ", key, prefix ? "*" : "");
  json request = {{"key", absl::Base64Escape(key)}};
  if (prefix) request["range_end"] = absl::Base64Escape(PrefixEnd(key));
  auto body = Call(call, "/v3/kv/deleterange", request.dump());
  if (!body.ok()) return body.status();
  auto answer = ParseAnswer(endpoint_, call, *body);
  if (!answer.ok()) return answer.status();
  return GatewayInt64(*answer, "deleted");
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(ttl));
  const std::string call = absl::StrCat("lease grant ttl ", seconds, " s");
  auto body = Call(call, "/v3/lease/grant", json{{"TTL", absl::StrCat(seconds)}}.dump());
  if (!body.ok()) return body.status();
  auto answer = ParseAnswer(endpoint_, call, *body);
  if (!answer.ok()) return answer.status();
  const int64_t id = GatewayInt64(*answer, "ID");
  if (id == 0) {
    return absl::DataLossError(absl::StrCat(
        "etcd at ", endpoint_, ": ", call, ": the answer has no lease ID: ", body->substr(0, 200)));
  }
  return id;
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t lease) {
  const std::string call = absl::StrCat("lease keepalive ", lease);
  auto body = Call(call, "/v3/lease/keepalive", json{{"ID", absl::StrCat(lease)}}.dump());
  if (!body.ok()) return body.status();
  // The gateway streams the answer: {"result":{"header":...,"ID":"..","TTL":".."}}. A lease
  // that is gone comes back without a TTL.
  auto answer = ParseAnswer(endpoint_, call, *body);
  if (!answer.ok()) return answer.status();
  const json& result = answer->contains("result") ? (*answer)["result"] : *answer;
  const int64_t ttl = GatewayInt64(result, "TTL");
  if (ttl <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd at ", endpoint_, ": ", call, ": the lease expired or was revoked"));
  }
  return absl::Seconds(ttl);
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  const std::string call = absl::StrCat("lease revoke ", lease);
  auto body = Call(call, "/v3/lease/revoke", json{{"ID", absl::StrCat(lease)}}.dump());
  if (!body.ok() && !absl::IsNotFound(body.status())) return body.status();
  return absl::OkStatus();
}

}  // namespace kvrail::registry
