// The Transport contract (engine/transport/transport_conformance.h) on the verbs backend, over
// the software verbs provider (softverbs): one rail, and two rails with the lanes split over
// them. Every test of the suite runs; none is filtered.
#include <memory>

#include "engine/transport/transport_conformance.h"
#include "engine/transport/verbs/softverbs/softverbs.h"
#include "engine/transport/verbs/verbs_transport.h"
#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

std::unique_ptr<Transport> MakeVerbs(std::vector<std::string> devices) {
  VerbsOptions options;
  options.api = &softverbs::SoftVerbsApi();
  options.lanes = 2;
  options.devices = std::move(devices);
  options.max_write_bytes = 16 << 20;
  // A silent peer fails a write within about 130 ms (the software provider's floor is 50 ms).
  options.qp_timeout = 12;
  options.qp_retry_cnt = 7;
  return VerbsTransport::Create(options).value();
}

class Rails : public testing::Environment {
 public:
  void SetUp() override {
    softverbs::SetRails({{.device = "softverbs0", .netdev = "lo", .gbps = 100},
                         {.device = "softverbs1", .netdev = "lo", .gbps = 200}});
  }
};
const testing::Environment* const kRails = testing::AddGlobalTestEnvironment(new Rails);

INSTANTIATE_TEST_SUITE_P(Verbs, TransportConformanceTest,
                         testing::Values(TransportFactory{"softverbs_one_rail",
                                                          [] { return MakeVerbs({"softverbs0"}); }},
                                         TransportFactory{
                                             "softverbs_two_rails",
                                             [] {
                                               return MakeVerbs({"softverbs0", "softverbs1"});
                                             }}),
                         TransportFactoryName);

}  // namespace
}  // namespace kvrail::transport
