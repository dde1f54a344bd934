// One registry shape for every "name -> entry" table of PyPTO: ops (OpRegistry), reference and CPU
// kernels, passes and backends. An entry is added once (a second entry of the same name is an
// InternalError: two definitions of one thing is a bug, not a user error), never moves once
// added, and is found by name in O(1) or by its position in registration order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pto/error.h"

namespace pto {

template <class T>
class Registry {
 public:
  // `what` names an entry in error messages: "op", "CPU kernel", "pass".
  explicit Registry(std::string what) : what_(std::move(what)) {}

  // Adds `entry` under `name` and returns it, at its final address; its index is size() - 1.
  T& add(const std::string& name, T entry) {
    PTO_CHECK(!name.empty()) << what_ << " without a name";
    auto [it, added] = index_.emplace(name, entries_.size());
    PTO_CHECK(added) << what_ << " '" << name << "' registered twice";
    entries_.emplace_back(name, std::move(entry));
    return entries_.back().second;
  }

  const T* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &entries_[it->second].second;
  }
  // The position of `name` in registration order, or -1 when absent.
  std::ptrdiff_t index_of(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? -1 : static_cast<std::ptrdiff_t>(it->second);
  }

  size_t size() const { return entries_.size(); }
  // The i-th entry and its name in registration order (0 <= i < size()).
  const T& at(size_t i) const {
    PTO_CHECK(i < entries_.size()) << "no " << what_ << " with index " << i;
    return entries_[i].second;
  }
  const std::string& name_at(size_t i) const {
    PTO_CHECK(i < entries_.size()) << "no " << what_ << " with index " << i;
    return entries_[i].first;
  }

  std::vector<std::string> names() const {  // sorted
    std::vector<std::string> out = names_in_order();
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> names_in_order() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& e : entries_) out.push_back(e.first);
    return out;
  }

 private:
  std::string what_;
  std::deque<std::pair<std::string, T>> entries_;  // a deque: entries keep their address
  std::unordered_map<std::string, size_t> index_;  // name -> position in entries_
};

}  // namespace pto
