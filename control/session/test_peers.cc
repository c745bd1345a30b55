#include "control/session/test_peers.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "control/wire/preallocation.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"
#include "tests/support/vectors.h"

namespace kvrail::session::testing {
namespace {

using nlohmann::json;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "test_peers: %s\n", what.c_str());
  std::abort();
}

template <typename T>
T Must(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", value.status().ToString()));
  return *std::move(value);
}

const json& FanoutScenario() {
  static const json* scenario = [] {
    json file = kvrail::testing::LoadVectors("prefill_scenarios.json");
    for (const json& s : file.at("scenarios")) {
      if (s.at("name") == "happy_path_fanout") return new json(s);
    }
    Die("prefill_scenarios.json has no happy_path_fanout");
  }();
  return *scenario;
}

}  // namespace

const layout::Contract& PrefillContract() {
  static const auto* contract = new layout::Contract(
      Must(layout::ParseContract(FanoutScenario().at("prefill_contract").get<std::string>()),
           "prefill contract"));
  return *contract;
}

const std::string& DecodeContractWire() {
  static const auto* wire = new std::string(kvrail::testing::FromHex(
      FanoutScenario().at("steps").at(0).at("frames_hex").at(5).get<std::string>()));
  return *wire;
}

const layout::Contract& DecodeContract() {
  static const auto* contract =
      new layout::Contract(Must(layout::ParseContract(DecodeContractWire()), "decode contract"));
  return *contract;
}

const std::string& DecodeManifestWire() {
  static const auto* wire = new std::string(kvrail::testing::FromHex(
      FanoutScenario().at("steps").at(3).at("frames_hex").at(2).get<std::string>()));
  return *wire;
}

const layout::Manifest& DecodeManifest() {
  static const auto* manifest =
      new layout::Manifest(Must(layout::ParseManifest(DecodeManifestWire()), "decode manifest"));
  return *manifest;
}

const layout::Manifest& SourceManifest() {
  static const auto* manifest = new layout::Manifest(
      Must(layout::ParseManifest(
               FanoutScenario().at("steps").at(5).at("source_manifest").get<std::string>()),
           "source manifest"));
  return *manifest;
}

std::string SessionOf(int decode_rank) {
  return absl::StrCat("10.1.0.", decode_rank + 1, ":", 15000 + decode_rank);
}

std::string ReplyEndpointOf(int decode_rank) {
  return absl::StrCat("tcp://10.1.0.", decode_rank + 1, ":", 17000 + decode_rank);
}

namespace {

std::vector<std::string> RegistrationWith(int decode_rank, std::optional<uint16_t> port,
                                          std::optional<uint64_t> arena_base,
                                          std::string contract_wire) {
  wire::Registration registration;
  registration.endpoint = absl::StrCat("10.1.0.", decode_rank + 1);
  registration.port = port.value_or(static_cast<uint16_t>(17000 + decode_rank));
  registration.session_id = SessionOf(decode_rank);
  registration.arena_base = arena_base.value_or(0x7e0000000000);
  registration.contract_wire = std::move(contract_wire);
  registration.decode_tp_size = 4;
  registration.decode_tp_rank = static_cast<uint32_t>(decode_rank);
  return Must(wire::BuildRegistration(registration), "registration");
}

}  // namespace

std::vector<std::string> RegistrationFrames(int decode_rank, std::optional<uint16_t> port,
                                            std::optional<uint64_t> arena_base) {
  return RegistrationWith(decode_rank, port, arena_base, DecodeContractWire());
}

std::vector<std::string> RegistrationFramesInForm(int decode_rank, layout::Revision form) {
  return RegistrationWith(decode_rank, {}, {},
                          Must(layout::SerializeContract(DecodeContract(), form), "contract"));
}

std::vector<std::string> PreallocationFrames(uint64_t room, const std::string& session_id,
                                             const std::string& manifest_wire) {
  return Must(wire::BuildPreallocation(wire::Preallocation{room, session_id, manifest_wire}),
              "pre-allocation");
}

std::vector<std::string> StatusFrames(uint64_t room, int status, int prefill_rank, int64_t token,
                                      std::optional<std::vector<int32_t>> spec_ids) {
  wire::StatusMessage message;
  message.room = room;
  message.status = status;
  message.prefill_rank = static_cast<uint32_t>(prefill_rank);
  message.bootstrap_token = token;
  message.spec_candidate_ids = std::move(spec_ids);
  return Must(wire::BuildStatus(message, wire::StatusForm::kSnapshot), "status");
}

std::vector<std::string> StatusFrames2026_09(uint64_t room, int status, int prefill_rank,
                                             int64_t cached_tokens,
                                             std::optional<double> bootstrap_logprob) {
  wire::StatusMessage message;
  message.room = room;
  message.status = status;
  message.prefill_rank = static_cast<uint32_t>(prefill_rank);
  message.cached_tokens = cached_tokens;
  message.bootstrap_logprob = bootstrap_logprob;
  return Must(wire::BuildStatus(message, wire::StatusForm::k2026_09), "status");
}

}  // namespace kvrail::session::testing
