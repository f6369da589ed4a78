// What a run reports: the table printed as the points finish, and the JSON
// file of every point and of the machine it ran on.
#pragma once

#include <string>
#include <vector>

#include "driver.h"
#include "options.h"

namespace ferry_bench {

// The output of a shell command, without its trailing newlines and spaces.
std::string shell(const char* cmd);

void write_json(const std::string& path, const Options& o, const std::vector<PointResult>& rs,
                double total_s);

void print_header(const char* baseline);
void print_row(const PointResult& r);

}  // namespace ferry_bench
