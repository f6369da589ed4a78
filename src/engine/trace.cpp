#include "engine/trace.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

namespace ferry::engine {

namespace {

// TransferReq alternatives (core/requests.h), in order.
constexpr const char* kOpNames[] = {"single_write", "paged_writes", "scatter",
                                    "barrier",      "send",         "prepared"};
constexpr size_t kMaxLanes = 16;

std::string json_string(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      o += fmt::format("\\u{:04x}", c);
    } else {
      o += char(c);
    }
  }
  return o + "\"";
}

double us(int64_t ns) {
  return double(ns) / 1000.0;
}

// Spans of one track spread over lanes so that no two spans of a lane
// overlap (the viewers nest spans of one thread and need them disjoint).
class Lanes {
 public:
  size_t place(int64_t start, int64_t end) {
    for (size_t i = 0; i < ends_.size(); ++i)
      if (ends_[i] <= start) {
        ends_[i] = end;
        return i;
      }
    if (ends_.size() < kMaxLanes) {
      ends_.push_back(end);
      return ends_.size() - 1;
    }
    auto it = std::min_element(ends_.begin(), ends_.end());
    *it = std::max(*it, end);
    return size_t(it - ends_.begin());
  }
  size_t used() const { return ends_.size(); }

 private:
  std::vector<int64_t> ends_;
};

}  // namespace

Trace::Trace(std::string path, size_t capacity)
    : path_(std::move(path)), capacity_(capacity == 0 ? 1 : capacity) {}

void Trace::span(std::string_view name, int64_t start_ns, int64_t end_ns, std::string_view track) {
  if (end_ns < start_ns) std::swap(start_ns, end_ns);
  std::lock_guard lk(mu_);
  UserSpan s{std::string(name), std::string(track), start_ns, end_ns};
  if (spans_.size() < capacity_)
    spans_.push_back(std::move(s));
  else
    spans_[size_t(next_ % capacity_)] = std::move(s);
  ++next_;
}

uint64_t Trace::dropped() const {
  std::lock_guard lk(mu_);
  return next_ > capacity_ ? next_ - capacity_ : 0;
}

Status Trace::write(const std::vector<TraceSource>& workers) const {
  const int pid = int(::getpid());
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& ev) {
    if (!first) out += ",\n";
    first = false;
    out += ev;
  };
  emit(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"ferry {}"}}}})",
                   pid, pid));
  auto thread_name = [&](int tid, const std::string& name) {
    emit(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":{}}}}})",
                     pid, tid, json_string(name)));
    emit(fmt::format(
        R"({{"name":"thread_sort_index","ph":"M","pid":{},"tid":{},"args":{{"sort_index":{}}}}})",
        pid, tid, tid));
  };
  for (const auto& w : workers) {
    if (!w.ring) continue;
    // Transfers of each NIC in start order, laid out in lanes.
    std::vector<core::TraceEvent> events;
    w.ring->for_each([&](const core::TraceEvent& e) { events.push_back(e); });
    std::stable_sort(events.begin(), events.end(),
                     [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    std::map<int, Lanes> lanes;  // by NIC
    std::map<int, bool> named;
    const int base = int(1000 * (w.group + 1));
    for (const auto& e : events) {
      const std::string nic =
          e.nic < w.nic_names.size() ? w.nic_names[e.nic] : fmt::format("{}", e.nic);
      if (e.kind == core::TraceEvent::kImm) {
        const int tid = base + 100 * e.nic + 99;
        if (!named[tid])
          thread_name(tid, fmt::format("worker {} NIC {} ({}) immediates", w.group, e.nic, nic));
        named[tid] = true;
        emit(fmt::format(
            R"({{"name":"imm {}","cat":"imm","ph":"i","s":"t","ts":{:.3f},"pid":{},"tid":{},"args":{{"count":{}}}}})",
            e.id, us(e.start_ns), pid, tid, e.bytes));
        continue;
      }
      const char* op = e.op < std::size(kOpNames) ? kOpNames[e.op] : "transfer";
      if (e.op == 0 && e.bytes == 0) op = "imm";
      const std::string status(code_name(Code(e.code)));
      if (e.kind == core::TraceEvent::kError) {
        const int tid = base + 100 * e.nic;
        emit(fmt::format(
            R"({{"name":"{} {}","cat":"error","ph":"i","s":"t","ts":{:.3f},"pid":{},"tid":{},"args":{{"transfer":{}}}}})",
            op, status, us(e.start_ns), pid, tid, e.id));
        continue;
      }
      const size_t lane = lanes[e.nic].place(e.start_ns, e.end_ns);
      const int tid = base + 100 * e.nic + int(lane);
      if (!named[tid])
        thread_name(tid, fmt::format("worker {} NIC {} ({}){}", w.group, e.nic, nic,
                                     lane ? fmt::format(" lane {}", lane) : std::string()));
      named[tid] = true;
      const std::string args = fmt::format(R"("transfer":{},"bytes":{},"writes":{},"status":"{}")",
                                           e.id, e.bytes, e.writes, status);
      emit(fmt::format(
          R"({{"name":"{}","cat":"transfer","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
          op, us(e.start_ns), us(e.end_ns - e.start_ns), pid, tid, args));
      // Submission to pick-up is the hand-off to the worker; pick-up to "posted", the
      // engine's path to the provider and the provider's post.
      if (e.picked_ns > 0 && e.picked_ns <= e.end_ns)
        emit(fmt::format(
            R"({{"name":"picked up","cat":"transfer","ph":"i","s":"t","ts":{:.3f},"pid":{},"tid":{},"args":{{"transfer":{}}}}})",
            us(e.picked_ns), pid, tid, e.id));
      if (e.first_post_ns > 0 && e.first_post_ns <= e.end_ns)
        emit(fmt::format(
            R"({{"name":"posted","cat":"transfer","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{},"args":{{{}}}}})",
            us(e.first_post_ns), us(e.end_ns - e.first_post_ns), pid, tid, args));
    }
    if (w.ring->dropped() > 0)
      emit(fmt::format(
          R"({{"name":"trace ring dropped {} older events","ph":"i","s":"p","ts":{:.3f},"pid":{},"tid":{}}})",
          w.ring->dropped(), events.empty() ? 0.0 : us(events.front().start_ns), pid, base));
  }
  {
    std::lock_guard lk(mu_);
    std::vector<const UserSpan*> spans;
    for (const auto& s : spans_) spans.push_back(&s);
    std::stable_sort(spans.begin(), spans.end(), [](const UserSpan* a, const UserSpan* b) {
      return a->start_ns < b->start_ns;
    });
    std::map<std::string, std::pair<int, Lanes>> tracks;
    std::map<int, bool> named;
    for (const UserSpan* s : spans) {
      auto [it, fresh] = tracks.try_emplace(s->track, 0, Lanes{});
      if (fresh) it->second.first = 100000 + 100 * int(tracks.size() - 1);
      const size_t lane = it->second.second.place(s->start_ns, s->end_ns);
      const int tid = it->second.first + int(lane);
      if (!named[tid])
        thread_name(tid, lane ? fmt::format("{} lane {}", s->track, lane) : s->track);
      named[tid] = true;
      if (s->end_ns == s->start_ns)
        emit(fmt::format(
            R"({{"name":{},"cat":"user","ph":"i","s":"t","ts":{:.3f},"pid":{},"tid":{}}})",
            json_string(s->name), us(s->start_ns), pid, tid));
      else
        emit(fmt::format(
            R"({{"name":{},"cat":"user","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{}}})",
            json_string(s->name), us(s->start_ns), us(s->end_ns - s->start_ns), pid, tid));
    }
  }
  out += "\n]}\n";
  const std::string tmp = path_ + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "w"), &std::fclose);
  if (!f) return Status(Code::kUnavailable, fmt::format("trace file '{}': cannot write", tmp));
  if (std::fwrite(out.data(), 1, out.size(), f.get()) != out.size())
    return Status(Code::kUnavailable, fmt::format("trace file '{}': short write", tmp));
  f.reset();
  if (std::rename(tmp.c_str(), path_.c_str()) != 0)
    return Status(Code::kUnavailable, fmt::format("trace file '{}': cannot rename", path_));
  return {};
}

}  // namespace ferry::engine
