#include "cluster/process/cpu_time.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>

namespace kvrail::process {
namespace {

TEST(CpuTimeTest, ParsesUtimePlusStimeAfterACommandNameWithSpacesAndParentheses) {
  // Fields 3..15 after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime stime.
  EXPECT_EQ(
      ParseCpuTicks("42 (kvrail (x) y) S 1 42 42 0 -1 4194560 10 0 0 0 250 37 0 0 20 0").value(),
      287u);
  EXPECT_FALSE(ParseCpuTicks("42 kvrail S 1").ok());
  EXPECT_FALSE(ParseCpuTicks("42 (kvrail) S 1 42").ok());
  EXPECT_FALSE(ParseCpuTicks("42 (kvrail) S 1 42 42 0 -1 4194560 10 0 0 0 x 37").ok());
}

TEST(CpuTimeTest, ThisProcessUsesCpuAsItSpins) {
  const double before = CpuSeconds(getpid()).value();
  // Spins until the kernel has charged it a tick (or 10 s, however loaded the machine is).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  volatile uint64_t spin = 0;
  double now = before;
  while (now <= before && std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 1000000; ++i) spin = spin + 1;
    now = CpuSeconds(getpid()).value();
  }
  EXPECT_GT(now, before);
  EXPECT_EQ(CpuSeconds(-5).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvrail::process
