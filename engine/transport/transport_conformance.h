// The Transport contract (engine/transport/transport.h) as parameterised tests, one behaviour
// per test, so that every backend is held to the same rules. A backend's test target depends
// on ":transport_conformance" and instantiates the suite with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(Loopback, TransportConformanceTest,
//                            testing::Values(TransportFactory{"loopback", [] { ... }}),
//                            TransportFactoryName);
//
// Each test makes two transports from the factory, a sender and a receiver, in this process.
#ifndef KVRAIL_ENGINE_TRANSPORT_TRANSPORT_CONFORMANCE_H_
#define KVRAIL_ENGINE_TRANSPORT_TRANSPORT_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "engine/transport/transport.h"
#include "gtest/gtest.h"

namespace kvrail::transport {

struct TransportFactory {
  std::string name;  // a test-name suffix: letters, digits and '_'
  // A fresh host-memory transport with at least 2 lanes and max_write_bytes >= 1 MiB.
  std::function<std::unique_ptr<Transport>()> make;
};

// For INSTANTIATE_TEST_SUITE_P's name generator.
std::string TransportFactoryName(const testing::TestParamInfo<TransportFactory>& info);

class TransportConformanceTest : public testing::TestWithParam<TransportFactory> {};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_TRANSPORT_CONFORMANCE_H_
