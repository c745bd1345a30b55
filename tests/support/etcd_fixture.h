// A gtest fixture whose suite shares one real etcd (EtcdProcess), started before its first test
// and killed after its last.
#ifndef KVRAIL_TESTS_SUPPORT_ETCD_FIXTURE_H_
#define KVRAIL_TESTS_SUPPORT_ETCD_FIXTURE_H_

#include <gtest/gtest.h>

#include <string>

#include "tests/support/etcd_process.h"

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

#endif  // KVRAIL_TESTS_SUPPORT_ETCD_FIXTURE_H_
