// ThreadPool: fixed workers, one parallel_for at a time per pool.
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "kiln/thread_pool.h"

namespace kiln {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::clamp(num_threads, 1, kMaxThreads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long an idle thread polls before it sleeps on a condition variable. Kernel calls in a
// method follow each other within microseconds; waking a sleeping thread costs a futex
// round trip (tens of microseconds on this class of VM), which dominated small kernels.
constexpr auto kSpin = std::chrono::microseconds(200);

// Polls `done()` for up to kSpin; true when it became true.
template <typename F>
bool spin_until(F&& done) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() - t0 > kSpin) return done();
  }
}

}  // namespace

void ThreadPool::worker(int index) {
  int64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    // job_, job_n_ and job_chunk_ were written before the release increment of generation_.
    const int64_t begin = index * job_chunk_;
    const int64_t end = std::min(job_n_, begin + job_chunk_);
    if (begin < end) (*job_)(begin, end);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int64_t parts = std::min<int64_t>(num_threads_, (n + min_chunk - 1) / min_chunk);
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (parts <= 1 || !busy.owns_lock()) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + num_threads_ - 1) / num_threads_;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    // Under mu_ so that a worker about to sleep on cv_ cannot miss the new generation.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(0, std::min(n, chunk));
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
}

ThreadPool* ThreadPool::default_pool() {
  static ThreadPool pool([] {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (const char* env = std::getenv("KILN_NUM_THREADS"); env != nullptr && *env != '\0') {
      // Only a whole positive number is taken; anything else is said once on stderr, not ignored
      // silently (the pool has no caller to return an error to).
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(env, &end, 10);
      if (errno == 0 && *end == '\0' && n > 0) return static_cast<int>(std::min<long>(n, kMaxThreads));
      std::fprintf(stderr, "kiln: ignoring KILN_NUM_THREADS='%s' (not a positive whole number); using %d threads\n",
                   env, cores);
    }
    return cores;
  }());
  return &pool;
}

}  // namespace kiln
