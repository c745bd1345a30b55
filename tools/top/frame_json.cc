#include "tools/top/frame_json.h"

#include <nlohmann/json.hpp>

namespace kvrail::top {
namespace {

const char* KindName(EndpointKind kind) {
  switch (kind) {
    case EndpointKind::kSidecar:
      return "sidecar";
    case EndpointKind::kBootstrap:
      return "bootstrap";
    case EndpointKind::kOther:
      break;
  }
  return "other";
}

nlohmann::json EndpointJson(const EndpointView& v) {
  nlohmann::json peers = nlohmann::json::array();
  for (const PeerRate& peer : v.peers) {
    peers.push_back({{"peer", peer.peer}, {"bytes_per_second", peer.bytes_per_second}});
  }
  nlohmann::json last_failure = nullptr;
  if (v.last_failure) {
    last_failure = {{"cause", v.last_failure->cause},
                    {"room", v.last_failure->room},
                    {"reason", v.last_failure->reason},
                    {"unix_seconds", v.last_failure->unix_seconds}};
  }
  return {{"endpoint", v.endpoint},
          {"up", v.up},
          {"error", v.error},
          {"kind", KindName(v.kind)},
          {"role", v.role},
          {"rank", v.rank},
          {"session", v.session},
          {"has_rates", v.has_rates},
          {"rooms_per_second", v.rooms_per_second},
          {"bytes_per_second", v.bytes_per_second},
          {"peers", peers},
          {"p99_seconds", v.p99_seconds ? nlohmann::json(*v.p99_seconds) : nlohmann::json()},
          {"failures", v.failures},
          {"failures_per_second", v.failures_per_second},
          {"last_failure", last_failure},
          {"bytes_in_flight", v.bytes_in_flight},
          {"requests_per_second", v.requests_per_second},
          {"registered_ranks", v.registered_ranks}};
}

}  // namespace

std::string FrameJson(const TopModel& model, const FrameOptions& options) {
  const Totals& t = model.totals;
  nlohmann::json endpoints = nlohmann::json::array();
  for (const EndpointView& view : model.rows) endpoints.push_back(EndpointJson(view));
  nlohmann::json frame = {{"time", options.time},
                          {"interval_seconds", options.interval_seconds},
                          {"totals",
                           {{"up", t.up},
                            {"down", t.down},
                            {"rooms_per_second", t.rooms_per_second},
                            {"bytes_per_second", t.bytes_per_second},
                            {"failures", t.failures},
                            {"failures_per_second", t.failures_per_second},
                            {"bytes_in_flight", t.bytes_in_flight}}},
                          {"endpoints", endpoints}};
  return frame.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvrail::top
