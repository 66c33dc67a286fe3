// The SIMD target of Kiln's optimized cpu kernels (src/kernels/cpu): one kernel source written over
// Google Highway, compiled for several instruction sets and dispatched at run time.
//
// Targets (best first): "avx3_dl" (AVX-512 with VNNI/VBMI2/BITALG, Highway's AVX3_DL), "avx3"
// (AVX-512 F/CD/DQ/BW/VL), "avx2" (AVX2 + FMA + F16C), "neon" (Arm Advanced SIMD; SVE CPUs run it
// too), and "scalar" (Highway's scalar fallback: the same kernel code on one plain C++ lane, for any
// other CPU). The process uses one target, chosen once (at the first program load or the first
// call below): the best one that this build compiled and this CPU supports, or the one named by
// the environment variable KILN_CPU_TARGET (for tests and per-instruction-set benchmarks). Kernel
// state (packed weights, tile sizes) is laid out for that target, so it never changes afterwards.
#pragma once

#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln {

/// The name of the target the optimized cpu kernels run on in this process (see the file
/// comment). When KILN_CPU_TARGET names a target that cannot run here, this is the best
/// supported one and cpu_target_status() says why the request was not honoured.
std::string cpu_target();

/// Every target compiled into this build that this CPU supports, best first (on x86-64 the last is
/// "scalar"; on aarch64 "neon", the architecture's baseline, below which nothing is compiled).
std::vector<std::string> available_cpu_targets();

/// Every target compiled into this build, best first, whether or not this CPU supports it.
std::vector<std::string> compiled_cpu_targets();

/// Ok, or InvalidArgument when KILN_CPU_TARGET is set to a name that is unknown, not compiled
/// into this build, or not supported by this CPU (the message lists the available targets).
/// Program::load returns this error, so a mistyped override never runs silently at another target.
Error cpu_target_status();

}  // namespace kiln
