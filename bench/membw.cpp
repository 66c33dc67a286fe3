// Read bandwidth probe of bench/llm.py: sums a 1 GiB buffer of uint64 (far larger than any cache)
// with T OpenMP threads, each thread its own contiguous slice, `passes` times; prints the best pass
// as one JSON object {"threads", "bytes", "best_s", "gb_per_s"} (GB = 1e9 bytes). Integer adds, so
// the compiler vectorizes the loop without reassociation flags. Built by bench/llm.py with
// g++ -O3 -march=native -fopenmp.  Usage: membw THREADS [MiB=1024] [passes=5]
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  const int passes = argc > 3 ? std::atoi(argv[3]) : 5;
  const size_t n = mib * (1u << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  omp_set_num_threads(threads);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = i * 2654435761u;  // first touch by the reading thread
  double best = 1e30;
  uint64_t sink = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (size_t i = 0; i < n; ++i) s += buf[i];
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink += s;
    if (dt < best) best = dt;
  }
  const double bytes = static_cast<double>(n) * sizeof(uint64_t);
  std::printf("{\"threads\": %d, \"bytes\": %.0f, \"best_s\": %.6f, \"gb_per_s\": %.3f, \"sink\": %llu}\n", threads,
              bytes, best, bytes / best / 1e9, static_cast<unsigned long long>(sink & 1));
  return 0;
}
