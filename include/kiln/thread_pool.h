// A small fixed-size thread pool shared by kernels.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

/// Runs `parallel_for` bodies on `num_threads` threads (the caller counts as one).
/// Thread-safe: concurrent parallel_for calls from different Methods are serialized per
/// pool; a parallel_for issued while the pool is busy with another caller runs inline on
/// the calling thread, so there is no deadlock and no oversubscription. Idle workers poll for
/// about 200 microseconds after a job before they sleep on a condition variable, so
/// back-to-back kernel calls do not pay a wake-up each; a delegate that runs its own pool
/// starts after Kiln's workers have gone to sleep or within that window.
/// Chunks are claimed dynamically (the caller first): a worker that is not running when the job
/// starts (descheduled on a busy machine, or still waking up) leaves its chunk to the threads
/// that are, and the caller never waits for a worker that has not claimed a chunk.
class ThreadPool {
 public:
  /// Largest pool size; larger requests are clamped (APIs that take a thread count from a
  /// user reject them with InvalidArgument first).
  static constexpr int kMaxThreads = 256;
  /// `num_threads` is clamped to [1, kMaxThreads].
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  /// Calls fn(begin, end) over [0, n) split into at most num_threads() contiguous chunks of at
  /// least `min_chunk` items. Returns when all chunks are done.
  void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  /// A process-wide pool sized by KILN_NUM_THREADS or the number of cores.
  static ThreadPool* default_pool();

 private:
  void worker(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex busy_;  // held by the caller of an active parallel_for
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  /// Claims and runs chunks of job generation `gen` until none is left (or a newer job started).
  void run_chunks(uint64_t gen);

  // The current job; written by the caller before state_ publishes it (release), read by a
  // worker only after it claimed a chunk of that job (acquire): the caller does not return
  // before every claimed chunk is done, so the fields stay valid while a chunk runs.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  uint64_t generation_ = 0;  // the caller's count of jobs (under busy_)
  // generation << 32 | number of chunks << 16 | next chunk to claim (chunks <= kMaxThreads).
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};  // chunks of the current job finished
  std::atomic<bool> stop_{false};
};

}  // namespace kiln
