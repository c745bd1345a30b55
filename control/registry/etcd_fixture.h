// A gtest fixture whose suite shares one real etcd (EtcdProcess), started before its first test
// and killed after its last.
#ifndef KVRAIL_CONTROL_REGISTRY_ETCD_FIXTURE_H_
#define KVRAIL_CONTROL_REGISTRY_ETCD_FIXTURE_H_

#include <gtest/gtest.h>

#include <string>

#include "control/registry/etcd_process.h"

namespace kvrail::registry {

class EtcdFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = EtcdProcess::Start();
    ASSERT_TRUE(started.ok()) << started.status();
    etcd_ = started->release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  static const std::string& endpoint() { return etcd_->endpoint(); }

  inline static EtcdProcess* etcd_ = nullptr;
};

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_ETCD_FIXTURE_H_
