#include "engine/metrics_exporter.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/log.h"

namespace ferry::engine {

namespace {

constexpr auto kIoTimeout = std::chrono::milliseconds(2000);
constexpr size_t kMaxRequest = 8192;

// Label values: backslash, double quote and newline escaped.
std::string esc(const std::string& v) {
  std::string o;
  o.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      o += '\\';
      o += c;
    } else if (c == '\n') {
      o += "\\n";
    } else {
      o += c;
    }
  }
  return o;
}

std::string braced(const std::string& labels) {
  return labels.empty() ? std::string() : "{" + labels + "}";
}

class Writer {
 public:
  void header(const char* name, const char* type, const char* help) {
    fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name,
                   type);
  }
  void sample(const char* name, const std::string& labels, double v) {
    if (std::isinf(v))
      fmt::format_to(std::back_inserter(out_), "{}{} +Inf\n", name, braced(labels));
    else
      fmt::format_to(std::back_inserter(out_), "{}{} {}\n", name, braced(labels), v);
  }
  void sample(const char* name, const std::string& labels, uint64_t v) {
    fmt::format_to(std::back_inserter(out_), "{}{} {}\n", name, braced(labels), v);
  }
  void histogram(const std::string& name, const std::string& labels, const LatencyHistogram& h) {
    uint64_t cum = 0;
    const std::string sep = labels.empty() ? "" : ",";
    for (size_t i = 0; i < h.counts.size(); ++i) {
      cum += h.counts[i];
      const std::string le =
          std::isinf(h.upper_s[i]) ? "+Inf" : fmt::format("{:.9g}", h.upper_s[i]);
      fmt::format_to(std::back_inserter(out_), "{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep,
                     le, cum);
    }
    fmt::format_to(std::back_inserter(out_), "{}_sum{} {:.9g}\n{}_count{} {}\n", name,
                   braced(labels), h.sum_s, name, braced(labels), h.count);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string nic_labels(size_t group, size_t nic, const std::string& name) {
  return fmt::format("group=\"{}\",nic=\"{}\",nic_name=\"{}\"", group, nic, esc(name));
}

}  // namespace

std::string prometheus_text(const EngineStats& s) {
  Writer w;
  auto peer_counter = [&](const char* name, const char* help, auto field) {
    w.header(name, "counter", help);
    for (const auto& p : s.peers)
      w.sample(name, nic_labels(p.group, p.nic, p.nic_name) + ",peer=\"" + esc(p.peer) + "\"",
               uint64_t(p.*field));
  };
  peer_counter("ferry_bytes_written_total",
               "Bytes of point-to-point transfers to the peer that ended OK", &PeerStats::bytes_ok);
  peer_counter("ferry_bytes_posted_total", "Bytes of writes and sends the provider took",
               &PeerStats::bytes_posted);
  peer_counter("ferry_writes_posted_total", "Writes the provider took", &PeerStats::writes_posted);
  peer_counter("ferry_sends_posted_total", "Sends the provider took", &PeerStats::sends_posted);
  peer_counter("ferry_backpressure_total",
               "Posts the provider refused for now (-FI_EAGAIN, queue full)",
               &PeerStats::backpressure);
  peer_counter("ferry_post_errors_total", "Posts that failed", &PeerStats::post_errors);
  w.header("ferry_peer_transfers_total", "counter",
           "Point-to-point transfers to the peer, by outcome");
  for (const auto& p : s.peers) {
    const std::string l =
        nic_labels(p.group, p.nic, p.nic_name) + ",peer=\"" + esc(p.peer) + "\",outcome=";
    w.sample("ferry_peer_transfers_total", l + "\"ok\"", p.transfers_ok);
    w.sample("ferry_peer_transfers_total", l + "\"failed\"", p.transfers_failed);
  }

  auto nic_metric = [&](const char* name, const char* type, const char* help, auto field) {
    w.header(name, type, help);
    for (const auto& n : s.nics) w.sample(name, nic_labels(n.group, n.nic, n.name), n.*field);
  };
  nic_metric("ferry_nic_writes_completed_total", "counter", "Local write and send completions",
             &NicStats::writes_completed);
  nic_metric("ferry_nic_completion_errors_total", "counter", "Completions with an error",
             &NicStats::completion_errors);
  nic_metric("ferry_nic_bytes_completed_total", "counter",
             "Bytes of transfers that ended OK, on this NIC", &NicStats::bytes_completed);
  nic_metric("ferry_imms_received_total", "counter", "Immediates received",
             &NicStats::imms_received);
  nic_metric("ferry_imm_errors_total", "counter", "Incoming immediates that failed",
             &NicStats::imm_errors);
  nic_metric("ferry_recvs_total", "counter", "Messages received", &NicStats::recvs);
  nic_metric("ferry_nic_outstanding_writes", "gauge", "Writes posted and not completed",
             &NicStats::outstanding);
  nic_metric("ferry_nic_pending_shards", "gauge", "Transfer shards waiting to be posted",
             &NicStats::pending);

  w.header("ferry_transfers_total", "counter", "Transfers by outcome (ok or the error code)");
  for (const auto& g : s.workers) {
    w.sample("ferry_transfers_total", fmt::format("group=\"{}\",outcome=\"ok\"", g.group),
             g.transfers_ok);
    for (const auto& [code, n] : g.transfers_failed)
      w.sample("ferry_transfers_total", fmt::format("group=\"{}\",outcome=\"{}\"", g.group, code),
               n);
  }
  auto group_metric = [&](const char* name, const char* type, const char* help, auto field) {
    w.header(name, type, help);
    for (const auto& g : s.workers)
      w.sample(name, fmt::format("group=\"{}\"", g.group), uint64_t(g.*field));
  };
  group_metric("ferry_requests_in_flight", "gauge", "Admitted requests not finished",
               &WorkerStats::in_flight);
  group_metric("ferry_command_queue_depth", "gauge", "Requests queued for the worker",
               &WorkerStats::queued);
  group_metric("ferry_registrations_total", "counter", "Memory registrations",
               &WorkerStats::registrations);
  group_metric("ferry_registered_bytes_total", "counter", "Bytes registered",
               &WorkerStats::registered_bytes);
  auto group_hist = [&](const char* name, const char* help, auto field) {
    w.header(name, "histogram", help);
    for (const auto& g : s.workers)
      w.histogram(name, fmt::format("group=\"{}\"", g.group), g.*field);
  };
  group_hist("ferry_transfer_latency_seconds", "Transfer submit to OnDone",
             &WorkerStats::transfer_latency);
  group_hist("ferry_queue_delay_seconds",
             "Transfer submit to the end of the worker turn that took it",
             &WorkerStats::queue_delay);
  group_hist("ferry_registration_seconds", "Time registering memory on every NIC of a group",
             &WorkerStats::registration_time);

  w.header("ferry_imm_value_received_total", "counter",
           "Immediates received per value (the busiest; imm=\"other\" for the rest)");
  for (const auto& v : s.top_imms)
    w.sample("ferry_imm_value_received_total", fmt::format("imm=\"{}\"", v.imm), v.count);
  w.sample("ferry_imm_value_received_total", "imm=\"other\"", s.imms_other);

  w.header("ferry_counter_wait_seconds", "histogram",
           "ImmCounter::wait, call to the arrival that satisfied it (or to the return)");
  w.histogram("ferry_counter_wait_seconds", "", s.counter_wait);
  w.header("ferry_callback_delay_seconds", "histogram",
           "Events queued for the callback thread until they run");
  w.histogram("ferry_callback_delay_seconds", "", s.callback_delay);
  w.header("ferry_watcher_poll_lag_seconds", "histogram",
           "Time between two reads of the UVM watcher words");
  w.histogram("ferry_watcher_poll_lag_seconds", "", s.watcher_poll_lag);
  w.header("ferry_callback_queue_depth", "gauge", "Events waiting for the callback thread");
  w.sample("ferry_callback_queue_depth", "", s.callback_queue_depth);
  w.header("ferry_callback_failures_total", "counter", "User callbacks that threw");
  w.sample("ferry_callback_failures_total", "", s.callback_failures);
  w.header("ferry_dropped_plain_imms_total", "counter", "on_imm events dropped at the queue bound");
  w.sample("ferry_dropped_plain_imms_total", "", s.dropped_plain_imms);
  // Process-wide: every engine of the process reports the same figures.
  const WakeStats& k = s.wake;
  w.header("ferry_wake_events_total", "counter",
           "How idle workers slept and were woken, and work other threads did for them "
           "(process-wide)");
  for (const WakeCount& c : kWakeCounts)
    w.sample("ferry_wake_events_total", fmt::format("event=\"{}\"", c.event), k.*c.field);
  w.header("ferry_workers_asleep", "gauge", "Workers blocked or napping now (process-wide)");
  w.sample("ferry_workers_asleep", "", double(k.asleep));
  w.header("ferry_stats_enabled", "gauge", "1 when the build keeps statistics");
  w.sample("ferry_stats_enabled", "", uint64_t(s.enabled ? 1 : 0));
  return w.take();
}

// ------------------------------------------------------------------ server

MetricsExporter::MetricsExporter(const std::string& address, std::function<std::string()> body)
    : body_(std::move(body)) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    throw Error(Code::kInvalidArgument,
                fmt::format("metrics address '{}': expected host:port (FERRY_METRICS)", address));
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
      rc != 0)
    throw Error(Code::kInvalidArgument,
                fmt::format("metrics address '{}': {}", address, ::gai_strerror(rc)));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    core::UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 16) == 0) {
      listen_fd_ = std::move(fd);
      break;
    }
    why = std::strerror(errno);
  }
  ::freeaddrinfo(res);
  if (!listen_fd_.valid())
    throw Error(Code::kUnavailable,
                fmt::format("metrics address '{}': cannot listen: {}", address, why));
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  char name[INET6_ADDRSTRLEN] = "?";
  int bound_port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, name, sizeof(name));
    bound_port = ntohs(in->sin_port);
    bound_ = fmt::format("{}:{}", name, bound_port);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, name, sizeof(name));
    bound_port = ntohs(in6->sin6_port);
    bound_ = fmt::format("[{}]:{}", name, bound_port);
  }
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  thread_ = std::thread([this] { run(); });
  core::log().info("metrics: http://{}/metrics", bound_);
}

MetricsExporter::~MetricsExporter() {
  stop();
}

void MetricsExporter::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_.get(), &one, sizeof(one));
  thread_.join();
  // Closed now, not at destruction: a scraper of a stopped engine is refused.
  listen_fd_.reset();
}

void MetricsExporter::run() {
  while (!stop_.load()) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (stop_.load()) break;
    if (!(fds[0].revents & POLLIN)) continue;
    const core::UniqueFd fd(
        ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) continue;
    try {
      serve(fd.get());
    } catch (const std::exception& e) {
      core::log().warn("metrics: {}", e.what());
    }
  }
}

void MetricsExporter::serve(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + kIoTimeout;
  auto wait = [&](short ev) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{fd, ev, 0}, {wake_fd_.get(), POLLIN, 0}};
    return ::poll(fds, 2, int(left.count())) > 0 && (fds[0].revents & (ev | POLLHUP | POLLERR)) &&
           !stop_.load();
  };
  std::string req;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (req.size() > kMaxRequest || !wait(POLLIN)) return;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    req.append(buf, size_t(n));
  }
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  const bool get = req.rfind("GET ", 0) == 0, head = req.rfind("HEAD ", 0) == 0;
  const auto path_end = req.find(' ', get ? 4 : 5);
  const std::string path = (get || head) && path_end != std::string::npos
                               ? req.substr(get ? 4 : 5, path_end - (get ? 4 : 5))
                               : std::string();
  if (!get && !head) {
    status = "405 Method Not Allowed";
    body = "GET /metrics\n";
  } else if (path == "/metrics" || path.rfind("/metrics?", 0) == 0 || path == "/") {
    body = body_();
    scrapes_.fetch_add(1);
  } else {
    status = "404 Not Found";
    body = "ferry serves /metrics\n";
  }
  std::string out = fmt::format(
      "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", status,
      type, body.size());
  if (!head) out += body;
  size_t sent = 0;
  while (sent < out.size()) {
    if (!wait(POLLOUT)) return;
    ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    sent += size_t(n);
  }
}

}  // namespace ferry::engine
