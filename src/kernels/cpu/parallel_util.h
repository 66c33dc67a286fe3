// Work splitting on Kiln's ThreadPool for the cpu kernels: contiguous ranges (parallel_range) and
// dynamically claimed tasks (parallel_tasks).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kiln/thread_pool.h"

namespace kiln::cpu {

/// Calls fn(t) once for every t in [0, ntasks), on up to pool->num_threads() threads (the caller
/// included). Threads claim tasks from a shared counter, so a thread that wakes late or is
/// preempted (a shared machine) leaves its tasks to the others instead of holding everyone up.
/// pool null or single-threaded, or ntasks <= 1: runs inline, in order.
template <typename Fn>
void parallel_tasks(ThreadPool* pool, int64_t ntasks, const Fn& fn) {
  if (pool == nullptr || pool->num_threads() <= 1 || ntasks <= 1) {
    for (int64_t t = 0; t < ntasks; ++t) fn(t);
    return;
  }
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(pool->num_threads(), ntasks);
  pool->parallel_for(workers, 1, [&](int64_t, int64_t) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < ntasks;
         t = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(t);
    }
  });
}

/// Runs fn(begin, end) over [0, n): on `pool` in at most num_threads() contiguous chunks when
/// there are at least 2 * min_chunk items, else inline in one call (small tensors stay on the
/// calling thread: waking the pool costs more than they take). pool may be null.
template <class F>
void parallel_range(ThreadPool* pool, int64_t n, int64_t min_chunk, F&& fn) {
  if (n <= 0) return;
  if (pool == nullptr || pool->num_threads() <= 1 || n < 2 * min_chunk) {
    fn(int64_t{0}, n);
    return;
  }
  pool->parallel_for(n, min_chunk, fn);
}

}  // namespace kiln::cpu
