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

namespace {

constexpr uint64_t gen_of(uint64_t s) { return s >> 32; }
constexpr uint64_t parts_of(uint64_t s) { return (s >> 16) & 0xFFFF; }
constexpr uint64_t next_of(uint64_t s) { return s & 0xFFFF; }

}  // namespace

void ThreadPool::run_chunks(uint64_t gen) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (gen_of(s) != (gen & 0xFFFFFFFFu) || next_of(s) >= parts_of(s)) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Chunk next_of(s) of this job is ours: the caller waits for it, so job_ is valid.
    const auto c = static_cast<int64_t>(next_of(s));
    const int64_t begin = c * job_chunk_;
    const int64_t end = std::min(job_n_, begin + job_chunk_);
    if (begin < end) (*job_)(begin, end);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<int64_t>(parts_of(s))) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker(int) {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return stop_.load(std::memory_order_acquire) || gen_of(state_.load(std::memory_order_acquire)) != seen;
    };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen_of(state_.load(std::memory_order_acquire));
    run_chunks(seen);
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
  const int64_t chunk = (n + parts - 1) / parts;
  const int64_t chunks = (n + chunk - 1) / chunk;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  done_.store(0, std::memory_order_relaxed);
  uint64_t gen = ++generation_ & 0xFFFFFFFFu;
  if (gen == 0) gen = ++generation_ & 0xFFFFFFFFu;  // 0 is the workers' "seen nothing yet"
  {
    // Under mu_ so that a worker about to sleep on cv_ cannot miss the new generation.
    std::lock_guard<std::mutex> lock(mu_);
    state_.store(gen << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
  }
  cv_.notify_all();
  run_chunks(gen);
  auto done = [&] { return done_.load(std::memory_order_acquire) == chunks; };
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
