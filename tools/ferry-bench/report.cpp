#include "report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "build_commit.h"
#include "plan.h"

namespace ferry_bench {

std::string shell(const char* cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd, "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), f)) out += buf;
    ::pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

namespace {

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += fmt::format("\\u{:04x}", c);
      continue;
    }
    o += c;
  }
  return o + "\"";
}

std::string json_num(double v) {
  return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null";
}

std::string join_nums(const std::vector<double>& v) {
  std::string out;
  for (double x : v) out += (out.empty() ? "" : ", ") + json_num(x);
  return out;
}

std::string json_result(const Result& r, bool latency) {
  if (!r.ran) return "null";
  return fmt::format(
      "{{\"requests\": {}, \"seconds\": {}, \"gb_s\": {}, \"gbps\": {}, \"ops_s\": {}, "
      "\"writes_s\": {}, \"p50_us\": {}, \"p99_us\": {}, \"cpu_us_per_op\": {}, "
      "\"cpu_us_per_write\": {}, \"errors\": {}, \"latency_is_half_rtt\": {}, \"verify\": {}}}",
      r.requests, json_num(r.seconds), json_num(r.gbs()), json_num(r.gbs() * 8), json_num(r.ops()),
      json_num(r.wps()), json_num(r.pct(0.5)), json_num(r.pct(0.99)), json_num(r.cpu_us_per_op()),
      json_num(r.cpu_us_per_write()), r.errors, latency ? "true" : "false",
      r.verify.empty() ? "null" : json_str(r.verify));
}

}  // namespace

void write_json(const std::string& path, const Options& o, const std::vector<PointResult>& rs,
                double total_s) {
  utsname u{};
  uname(&u);
  std::string model = shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'");
  std::ofstream f(path);
  f << "{\n  \"meta\": {";
  f << fmt::format(
      "\"command\": {}, \"git_commit\": {}, \"provider\": {}, \"nics\": {}, \"window\": {}, "
      "\"poll\": {}, \"seconds_per_point\": {}, \"iters\": {}, \"repeat\": {}, \"verify\": {}, "
      "\"raw\": {}, \"baseline\": {}, \"gpu\": {}, \"nproc\": {}, \"cpu_model\": {}, "
      "\"kernel\": {}, \"date\": {}, "
      "\"total_seconds\": {}, "
      "\"loadavg_start\": {}, \"loadavg_end\": {}",
      json_str(o.command_line), json_str(FERRY_BENCH_BUILD_COMMIT), json_str(o.provider),
      o.nic_names.size(), o.window, json_str(o.poll), o.seconds, o.iters, o.repeat,
      o.verify ? "true" : "false", o.no_raw ? "false" : "true", json_str(o.baseline()),
      o.gpu.empty() ? std::string("null") : fmt::format("[{}, {}]", o.gpu[0], o.gpu[1]),
      sysconf(_SC_NPROCESSORS_ONLN), json_str(model),
      json_str(std::string(u.sysname) + " " + u.release),
      json_str(shell("date -u +%Y-%m-%dT%H:%M:%SZ")), json_num(total_s), json_str(o.load_start),
      json_str(shell("cut -d' ' -f1-3 /proc/loadavg")));
  f << "},\n  \"points\": [\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const auto& r = rs[i];
    f << fmt::format(
        "    {{\"kind\": \"{}\", \"size\": {}, \"count\": {}, \"imm\": {}, \"window\": {}, "
        "\"bytes_per_req\": {}, \"writes_per_req\": {}, \"fraction_of_raw\": {}, "
        "\"rep_fractions\": [{}],\n"
        "     \"ferry\": {},\n     \"raw\": {}}}{}\n",
        kind_name(r.point.kind), r.point.size, r.point.count, r.point.imm ? "true" : "false",
        r.window, r.bytes_per_req, r.writes_per_req, json_num(r.fraction()),
        join_nums(r.rep_fractions), json_result(r.ferry, r.point.latency()),
        json_result(r.raw, r.point.latency()), i + 1 < rs.size() ? "," : "");
  }
  f << "  ]\n}\n";
}

void print_header(const char* baseline) {
  fmt::print(
      "{:<13}{:>6}{:>6}{:>4}{:>4} |{:>7}{:>7}{:>9}{:>9}{:>8}{:>8}{:>7} |{:>7}{:>9}{:>8}{:>8}{:>7} "
      "|{:>6}  {}\n",
      "kind", "size", "count", "imm", "win", "GB/s", "Gbps", "ops/s", "wr/s", "p50us", "p99us",
      "cpuus", "GB/s", "ops/s", "p50us", "p99us", "cpuus", "frac", "verify");
  fmt::print("{:<42}|{:^66}|{:^47}|\n", "", "ferry", baseline);
}

void print_row(const PointResult& r) {
  auto v = [](const Result& x) {
    if (x.verify.empty()) return std::string();
    return x.verify == "ok" ? std::string("ok") : "FAIL: " + x.verify;
  };
  const Result& f = r.ferry;
  const Result& w = r.raw;
  // An explicit space before every number, so that a value wider than its
  // column (a paged p99 of 100 ms) cannot run into its neighbour.
  std::string raw = w.ran ? fmt::format(" {:>6.3f} {:>8.0f} {:>7.1f} {:>7.1f} {:>6.2f}", w.gbs(),
                                        w.ops(), w.pct(0.5), w.pct(0.99), w.cpu_us_per_op())
                          : fmt::format("{:>39}", "-");
  std::string verify = v(f);
  if (w.ran && !v(w).empty() && v(w) != "ok") verify += " raw " + v(w);
  fmt::print(
      "{:<13}{:>6}{:>6}{:>4}{:>4} | {:>6.3f} {:>6.2f} {:>8.0f} {:>8.0f} {:>7.1f} {:>7.1f} {:>6.2f} "
      "|{} "
      "|{:>6.3f}  {}{}{}\n",
      kind_name(r.point.kind), r.point.size_label(), r.point.count, r.point.imm ? "y" : "n",
      r.window, f.gbs(), f.gbs() * 8, f.ops(), f.wps(), f.pct(0.5), f.pct(0.99), f.cpu_us_per_op(),
      raw, r.fraction(), verify, f.errors ? " ERRORS" : "", w.errors ? " RAW-ERRORS" : "");
  std::fflush(stdout);
}

}  // namespace ferry_bench
