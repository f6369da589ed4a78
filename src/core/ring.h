// Growable FIFO ring: amortised allocation-free once it reached its working size.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ferry::core {

template <typename T>
class Ring {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  void pop_front() {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  void push_back(T v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
    ++size_;
  }

 private:
  void grow() {
    std::vector<T> n(buf_.empty() ? 64 : buf_.size() * 2);
    for (size_t i = 0; i < size_; ++i) n[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_ = std::move(n);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0, size_ = 0;
};

}  // namespace ferry::core
