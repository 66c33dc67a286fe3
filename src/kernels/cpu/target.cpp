// The run-time choice of the SIMD target for the optimized cpu kernels (include/kiln/cpu_target.h).
//
// Every kernel file is compiled once per target by Highway (hwy/foreach_target.h) and calls its
// per-target code through HWY_DYNAMIC_DISPATCH, which reads Highway's process-wide chosen target.
// select() sets that once, before any kernel runs (register_cpu_kernels calls it when the kernel
// registry is built), to the best supported target or to KILN_CPU_TARGET's.
#include "kernels/cpu/target.h"

#include "hwy/highway.h"
#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <mutex>

#include "hwy/targets.h"
#include "kiln/cpu_target.h"

namespace kiln {
namespace cpu {
namespace {

struct NamedTarget {
  int64_t bit;
  const char* name;
};
// Best first (Highway: a lower bit is a better target). HWY_EMU128 and HWY_SCALAR are both
// "scalar": a build has one of them as its baseline.
constexpr NamedTarget kNames[] = {
    {HWY_AVX3_DL, "avx3_dl"}, {HWY_AVX3, "avx3"}, {HWY_AVX2, "avx2"}, {HWY_SVE2, "sve2"},
    {HWY_SVE, "sve"},         {HWY_NEON, "neon"}, {HWY_EMU128, "scalar"}, {HWY_SCALAR, "scalar"},
};

std::vector<std::string> names_in(int64_t mask) {
  std::vector<std::string> out;
  for (const NamedTarget& t : kNames) {
    if ((mask & t.bit) != 0) out.emplace_back(t.name);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

hwy::ChosenTarget& kiln_chosen() {
  static hwy::ChosenTarget t;
  return t;
}

struct Selection {
  int64_t bit = 0;        ///< the chosen target
  int64_t available = 0;  ///< compiled and supported by this CPU
  Error status;
};

const Selection& selection() {
  static const Selection s = [] {
    Selection out;
    // hwy::SupportedTargets() is called here only: in Highway 1.0.3 every call also resets the
    // dispatch target to the best one, which would silently undo a KILN_CPU_TARGET choice.
    const int64_t available = hwy::SupportedTargets() & HWY_TARGETS;
    out.available = available;
    out.bit = available & -available;  // the lowest bit: the best target
    if (const char* env = std::getenv("KILN_CPU_TARGET"); env != nullptr && *env != '\0') {
      const std::string want(env);
      int64_t bits = 0;
      for (const NamedTarget& t : kNames) {
        if (want == t.name) bits |= t.bit;
      }
      if (bits == 0) {
        out.status = Error(ErrorCode::InvalidArgument,
                           "KILN_CPU_TARGET='" + want + "' is not a cpu kernel target (targets: avx3_dl, avx3, "
                           "avx2, neon, scalar; available here: " + join(names_in(available)) + ")");
      } else if ((bits & HWY_TARGETS) == 0) {
        out.status = Error(ErrorCode::InvalidArgument,
                           "KILN_CPU_TARGET='" + want + "': this build of Kiln has no kernels for it (compiled: " +
                               join(names_in(HWY_TARGETS)) + ")");
      } else if ((bits & available) == 0) {
        out.status = Error(ErrorCode::InvalidArgument,
                           "KILN_CPU_TARGET='" + want + "': this CPU does not support it (available here: " +
                               join(names_in(available)) + ")");
      } else {
        out.bit = bits & available & -(bits & available);
      }
    }
    hwy::GetChosenTarget().Update(out.bit);  // for any HWY_DYNAMIC_DISPATCH; Kiln's own below
    kiln_chosen().Update(out.bit);
    return out;
  }();
  return s;
}

}  // namespace

const char* target_name(int64_t bit) {
  for (const NamedTarget& t : kNames) {
    if (t.bit == bit) return t.name;
  }
  return "unknown";
}

int64_t select_target() { return selection().bit; }

const hwy::ChosenTarget& chosen_target() {
  selection();
  return kiln_chosen();
}

}  // namespace cpu

std::string cpu_target() { return cpu::target_name(cpu::select_target()); }

std::vector<std::string> available_cpu_targets() { return cpu::names_in(cpu::selection().available); }

std::vector<std::string> compiled_cpu_targets() { return cpu::names_in(HWY_TARGETS); }

Error cpu_target_status() { return cpu::selection().status; }

}  // namespace kiln
