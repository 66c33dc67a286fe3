// Names the cpu kernel target at the start of every kiln_tests run ("kiln cpu target: avx2"), so
// a log says which instruction set the cpu-kernel tests covered, and exits with CTest's skip code
// (77) when KILN_CPU_TARGET asks for a target that cannot run here (not compiled into this build,
// or not supported by this CPU): the per-target reruns (tests/CMakeLists.txt) then show as
// skipped on a machine without that target, never as passed.
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>

#include "kernels/cpu/target.h"
#include "kiln/cpu_target.h"

namespace {

class CpuTargetEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const kiln::Error status = kiln::cpu_target_status();
    if (!status.ok()) {
      std::printf("kiln cpu target: unavailable: %s\n", status.message().c_str());
      std::fflush(stdout);
      std::exit(77);
    }
    std::string available;
    for (const std::string& t : kiln::available_cpu_targets()) available += (available.empty() ? "" : ", ") + t;
    std::printf("kiln cpu target: %s (available: %s)\n", kiln::cpu_target().c_str(), available.c_str());
    // The code Highway dispatches to must be the chosen target's, also after the listing above
    // (Highway 1.0.3's SupportedTargets() resets the dispatch target: see target.cpp).
    const int64_t dispatched = kiln::cpu::dispatched_target();
    if (dispatched != kiln::cpu::select_target()) {
      std::printf("kiln cpu target: dispatch runs %s, not the chosen %s\n", kiln::cpu::target_name(dispatched),
                  kiln::cpu_target().c_str());
      std::exit(1);
    }
  }
};

const ::testing::Environment* const kEnvironment = ::testing::AddGlobalTestEnvironment(new CpuTargetEnvironment);

}  // namespace

#include "hwy/targets.h"

namespace {

// Another user of libhwy in the process (Highway 1.0.3 resets its process-wide chosen target in
// every hwy::SupportedTargets() call) must not move Kiln's kernels to another target: their
// state (packed weights, tiles) is laid out for the chosen one (kernels/cpu/dispatch.h).
TEST(CpuTarget, AnotherHighwayUserDoesNotChangeTheTarget) {
  const int64_t chosen = kiln::cpu::select_target();
  ASSERT_EQ(kiln::cpu::dispatched_target(), chosen);
  (void)hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  EXPECT_EQ(kiln::cpu::dispatched_target(), chosen)
      << "dispatch moved to " << kiln::cpu::target_name(kiln::cpu::dispatched_target());
  EXPECT_EQ(kiln::cpu_target(), kiln::cpu::target_name(chosen));
}

}  // namespace
