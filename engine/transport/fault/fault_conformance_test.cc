// The Transport contract (engine/transport/transport_conformance.h), run on FaultTransport over
// the loopback backend with no fault set: the wrapper itself keeps the contract.
#include <memory>

#include "engine/transport/fault/fault_transport.h"
#include "engine/transport/loopback/loopback_transport.h"
#include "engine/transport/transport_conformance.h"
#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Fault, TransportConformanceTest,
    testing::Values(TransportFactory{
        "fault_loopback",
        []() -> std::unique_ptr<Transport> {
          return std::make_unique<FaultTransport>(
              LoopbackTransport::Create({.lanes = 4, .max_write_bytes = 16 << 20}).value());
        }}),
    TransportFactoryName);

}  // namespace
}  // namespace kvrail::transport
