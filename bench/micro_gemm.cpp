// Microbenchmark of cpu::sgemm (src/kernels/cpu/gemm.h): GFLOP/s for a few shapes at 1 and 2
// threads. Not a test and not part of the build; figures only. Build from the repository root
// after building the library (build/libkiln_runtime.a; KILN_CPU_TARGET picks the SIMD target):
//   g++ -O2 -std=c++20 -Isrc -Iinclude bench/micro_gemm.cpp build/libkiln_runtime.a -lhwy -lpthread -o /tmp/micro_gemm
//   /tmp/micro_gemm [reps]
// Prints best-of-`reps` wall-clock GFLOP/s and, for 1 thread, GFLOP/s by thread CPU time (less
// sensitive to other load on a shared machine). FLOP = 2 * M * N * K.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kiln/cpu_target.h"

namespace {

double now(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  struct Shape {
    int M, N, K;
    const char* what;
  };
  const Shape shapes[] = {
      {512, 512, 512, "square"},
      {1024, 1024, 1024, "square"},
      {64, 3136, 576, "resnet18 layer1 3x3 conv (Cout x HW x Cin*9)"},
      {512, 49, 4608, "resnet18 layer4 3x3 conv"},
      {960, 49, 160, "mv3-large 1x1 conv at 7x7"},
      {77, 768, 768, "CLIP-like linear"},
      {3136, 64, 576, "tall-skinny"},
  };
  kiln::ThreadPool pool2(2);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::printf("%-46s %5s %5s %5s  %10s %10s %10s\n", "shape", "M", "N", "K", "1T wall", "1T cpu", "2T wall");
  for (const Shape& s : shapes) {
    std::vector<float> A(static_cast<size_t>(s.M) * s.K), B(static_cast<size_t>(s.K) * s.N), C(static_cast<size_t>(s.M) * s.N);
    for (float& v : A) v = dist(rng);
    for (float& v : B) v = dist(rng);
    const double flop = 2.0 * s.M * s.N * s.K;
    const int inner = std::max(1, static_cast<int>(1e9 / flop));
    auto run = [&](kiln::ThreadPool* pool, clockid_t clock) {
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        const double t0 = now(clock);
        for (int i = 0; i < inner; ++i) {
          kiln::cpu::sgemm(false, false, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f, C.data(), s.N, {}, pool);
        }
        best = std::min(best, (now(clock) - t0) / inner);
      }
      return flop / best * 1e-9;
    };
    const double w1 = run(nullptr, CLOCK_MONOTONIC);
    const double c1 = run(nullptr, CLOCK_THREAD_CPUTIME_ID);
    const double w2 = run(&pool2, CLOCK_MONOTONIC);
    std::printf("%-46s %5d %5d %5d  %10.1f %10.1f %10.1f\n", s.what, s.M, s.N, s.K, w1, c1, w2);
  }
  std::printf("(GFLOP/s; SIMD target: %s)\n", kiln::cpu_target().c_str());
  return 0;
}
