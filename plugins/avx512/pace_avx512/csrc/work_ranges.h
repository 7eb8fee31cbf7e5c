// Contiguous ranges of work items, one per thread, with work stealing: a thread takes its own
// range's items from the front, in order (one sequential stream through memory), and once it
// is done takes the other ranges' items from their back ends. A thread slowed down (another
// process on its core, a slower share of memory) then no longer holds every other thread at
// the end of the parallel region: they finish its range for it.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace pace_avx512 {

class StealRanges {
 public:
  // `sizes[t]`: the number of items in range t, below 2^32 (one range per thread of the
  // region to come; ranges whose thread never comes are finished by the others).
  explicit StealRanges(const std::vector<int64_t>& sizes) : cursors_(sizes.size()) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      if (sizes[t] < 0 || sizes[t] >> 32) throw std::length_error("StealRanges: range size out of [0, 2^32)");
      cursors_[t].v.store(pack(0, sizes[t]), std::memory_order_relaxed);
    }
  }

  // Thread t's part of the work: f(t, k, true) for its own range's items k from the front,
  // then f(u, k, false) for the items left in every other range u, from their back ends.
  template <class F>
  void drain(int t, F&& f) {
    const int n = (int)cursors_.size();
    int64_t k;
    while (take(t, k, true)) f(t, k, true);
    for (int i = 1; i < n; ++i) {
      const int u = (t + i) % n;
      while (take(u, k, false)) f(u, k, false);
    }
  }

 private:
  struct alignas(64) Cursor {  // (front << 32) | back: items [front, back) are left
    std::atomic<uint64_t> v{0};
  };

  static uint64_t pack(int64_t front, int64_t back) { return (uint64_t)front << 32 | (uint64_t)back; }

  // The next item of range t, from its front or its back, into k; false once it is empty.
  bool take(int t, int64_t& k, bool front) {
    std::atomic<uint64_t>& c = cursors_[t].v;
    uint64_t cur = c.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = (int64_t)(cur >> 32), b = (int64_t)(cur & 0xFFFFFFFFu);
      if (f >= b) return false;
      const uint64_t next = front ? pack(f + 1, b) : pack(f, b - 1);
      if (c.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
        k = front ? f : b - 1;
        return true;
      }
    }
  }

  std::vector<Cursor> cursors_;
};

// Items [0, items) in n contiguous ranges of nearly equal size (range t: [items t / n,
// items (t + 1) / n)), drained with stealing: drain(t, f) calls f(item, next_own) for each item
// thread t takes, next_own when item + 1 is the one it takes next (a prefetch hint).
class EvenStealRanges {
 public:
  EvenStealRanges(int64_t items, int n) : items_(items), n_(n), ranges_(sizes(items, n)) {}

  template <class F>
  void drain(int t, F&& f) {
    ranges_.drain(t, [&](int u, int64_t k, bool own) {
      const int64_t item = start(u) + k;
      f(item, own && item + 1 < start(u + 1));
    });
  }

 private:
  int64_t start(int64_t t) const { return items_ * t / n_; }
  static std::vector<int64_t> sizes(int64_t items, int n) {
    std::vector<int64_t> out(n);
    for (int t = 0; t < n; ++t) out[t] = items * (t + 1) / n - items * t / n;
    return out;
  }

  int64_t items_;
  int n_;
  StealRanges ranges_;
};

}  // namespace pace_avx512
