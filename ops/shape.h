// \file Shape: a tensor's dimensions, held inline up to kInline of them.
//
// A Tensor is a handle copied everywhere (a kernel's operands, a run's
// inputs, a program's results); with its dimensions in a std::vector each
// copy was a heap allocation, most of a generic Tree-LSTM step's (about 40%
// fewer since, bench/RESULTS.md, session 42). Shapes of
// up to kInline dimensions (every one the runtime makes: a model's rank plus
// a batch dimension) live in the object; larger ones on the heap. The
// interface is std::vector<int64_t>'s, which converts to and from it.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace pejit {

class Shape {
 public:
  using value_type = int64_t;
  using size_type = size_t;
  using difference_type = ptrdiff_t;
  using reference = int64_t&;
  using const_reference = const int64_t&;
  using pointer = int64_t*;
  using const_pointer = const int64_t*;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  static constexpr size_t kInline = 5;

  Shape() = default;
  explicit Shape(size_t n, int64_t value = 0) { assign(n, value); }
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  template <typename It, typename = std::enable_if_t<!std::is_integral_v<It>>>
  Shape(It first, It last) {
    assign(first, last);
  }
  Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }  // NOLINT: as a vector converts
  Shape(const Shape& other) { assign(other.begin(), other.end()); }
  Shape(Shape&& other) noexcept { Steal(other); }
  Shape& operator=(const Shape& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      Free();
      Steal(other);
    }
    return *this;
  }
  Shape& operator=(std::initializer_list<int64_t> dims) {
    assign(dims.begin(), dims.end());
    return *this;
  }
  ~Shape() { Free(); }

  operator std::vector<int64_t>() const { return {begin(), end()}; }  // NOLINT: as a vector converts

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return capacity_; }
  int64_t* data() { return data_; }
  const int64_t* data() const { return data_; }

  int64_t& operator[](size_t i) { return data_[i]; }
  const int64_t& operator[](size_t i) const { return data_[i]; }
  int64_t& at(size_t i) { return data_[Checked(i)]; }
  const int64_t& at(size_t i) const { return data_[Checked(i)]; }
  int64_t& front() { return data_[0]; }
  const int64_t& front() const { return data_[0]; }
  int64_t& back() { return data_[size_ - 1]; }
  const int64_t& back() const { return data_[size_ - 1]; }

  iterator begin() { return data_; }
  iterator end() { return data_ + size_; }
  const_iterator begin() const { return data_; }
  const_iterator end() const { return data_ + size_; }
  const_iterator cbegin() const { return data_; }
  const_iterator cend() const { return data_ + size_; }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }

  void reserve(size_t n) {
    if (n <= capacity_) return;
    int64_t* grown = new int64_t[n];
    std::copy(begin(), end(), grown);
    Free();
    data_ = grown;
    capacity_ = n;
  }
  void clear() { size_ = 0; }
  void resize(size_t n, int64_t value = 0) {
    reserve(n);
    if (n > size_) std::fill(data_ + size_, data_ + n, value);
    size_ = n;
  }
  void push_back(int64_t d) {
    if (size_ == capacity_) reserve(capacity_ * 2);
    data_[size_++] = d;
  }
  int64_t& emplace_back(int64_t d) {
    push_back(d);
    return back();
  }
  void pop_back() { --size_; }

  void assign(size_t n, int64_t value) {
    size_ = 0;
    reserve(n);
    std::fill_n(data_, n, value);
    size_ = n;
  }
  template <typename It, typename = std::enable_if_t<!std::is_integral_v<It>>>
  void assign(It first, It last) {
    const auto n = static_cast<size_t>(std::distance(first, last));
    size_ = 0;
    reserve(n);
    std::copy(first, last, data_);
    size_ = n;
  }
  void assign(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }

  iterator insert(const_iterator pos, int64_t d) { return insert(pos, size_t{1}, d); }
  iterator insert(const_iterator pos, size_t n, int64_t d) {
    const size_t at = Open(pos, n);
    std::fill_n(data_ + at, n, d);
    return data_ + at;
  }
  template <typename It, typename = std::enable_if_t<!std::is_integral_v<It>>>
  iterator insert(const_iterator pos, It first, It last) {
    // Copied first: the range may be this shape's own.
    Shape dims;
    dims.assign(first, last);
    const size_t at = Open(pos, dims.size());
    std::copy(dims.begin(), dims.end(), data_ + at);
    return data_ + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<int64_t> dims) {
    return insert(pos, dims.begin(), dims.end());
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const size_t at = static_cast<size_t>(first - data_), n = static_cast<size_t>(last - first);
    std::copy(data_ + at + n, data_ + size_, data_ + at);
    size_ -= n;
    return data_ + at;
  }

  void swap(Shape& other) noexcept {
    Shape t(std::move(other));
    other = std::move(*this);
    *this = std::move(t);
  }

  friend bool operator==(const Shape& a, const Shape& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }
  friend std::strong_ordering operator<=>(const Shape& a, const Shape& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const Shape& a, const std::vector<int64_t>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  int64_t* data_ = inline_;
  size_t size_ = 0;
  size_t capacity_ = kInline;
  int64_t inline_[kInline] = {};

  bool OnHeap() const { return data_ != inline_; }
  void Free() {
    if (OnHeap()) delete[] data_;
    data_ = inline_;
    capacity_ = kInline;
  }
  void Steal(Shape& other) {
    if (other.OnHeap()) {
      data_ = other.data_;
      capacity_ = other.capacity_;
      other.data_ = other.inline_;
      other.capacity_ = kInline;
    } else {
      std::copy(other.begin(), other.end(), inline_);
    }
    size_ = other.size_;
    other.size_ = 0;
  }
  size_t Checked(size_t i) const {
    if (i >= size_) throw std::out_of_range("Shape::at: dimension " + std::to_string(i) + " of " + std::to_string(size_));
    return i;
  }
  // Makes room for n dimensions at pos; returns pos's index.
  size_t Open(const_iterator pos, size_t n) {
    const size_t at = static_cast<size_t>(pos - data_);
    if (size_ + n > capacity_) reserve(std::max(size_ + n, capacity_ * 2));
    std::copy_backward(data_ + at, data_ + size_, data_ + size_ + n);
    size_ += n;
    return at;
  }
};

}  // namespace pejit
