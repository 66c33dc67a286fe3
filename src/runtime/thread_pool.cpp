// ThreadPool: fixed workers, one parallel_for at a time per pool.
#include <algorithm>
#include <cstdlib>

#include "kiln/thread_pool.h"

namespace kiln {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  int64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n, chunk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
    }
    const int64_t begin = index * chunk;
    const int64_t end = std::min(n, begin + chunk);
    if (begin < end) (*job)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  cv_.notify_all();
  fn(0, std::min(n, chunk));
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

ThreadPool* ThreadPool::default_pool() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("KILN_NUM_THREADS")) {
      const int n = std::atoi(env);
      if (n > 0) return n;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return &pool;
}

}  // namespace kiln
