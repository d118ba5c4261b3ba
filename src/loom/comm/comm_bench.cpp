#include "loom/comm/comm_bench.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "loom/comm/mpi/backend.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Elements per rank for `op` at `bytes` (nccl-tests' convention); 0 = the size is too small.
int64_t count_for(const std::string& op, int64_t bytes, size_t element, int ranks) {
  const int64_t elements = bytes / static_cast<int64_t>(element);
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return elements / ranks;
  return elements;
}

// The size reported for `count`: what the definitions above measure.
int64_t size_for(const std::string& op, int64_t count, size_t element, int ranks) {
  const int64_t bytes = count * static_cast<int64_t>(element);
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return bytes * ranks;
  return bytes;
}

struct Buffers {
  std::unique_ptr<std::byte[]> send;
  std::unique_ptr<std::byte[]> recv;
};

void run_once(Communicator& world, const std::string& op, Buffers& b, int64_t count, const CommBenchOptions& o) {
  if (op == "all_reduce") {
    world.all_reduce(b.recv.get(), count, o.dtype, o.reduce);
  } else if (op == "all_gather") {
    world.all_gather(b.send.get(), b.recv.get(), count, o.dtype);
  } else if (op == "reduce_scatter") {
    world.reduce_scatter(b.send.get(), b.recv.get(), count, o.dtype, o.reduce);
  } else if (op == "broadcast") {
    world.broadcast(b.recv.get(), count, o.dtype, 0);
  } else if (op == "reduce") {
    world.reduce(b.send.get(), world.rank() == 0 ? b.recv.get() : nullptr, count, o.dtype, o.reduce, 0);
  } else if (op == "all_to_all") {
    world.all_to_all(b.send.get(), b.recv.get(), count, o.dtype);
  } else if (op == "memcpy") {
    std::memcpy(b.recv.get(), b.send.get(), static_cast<size_t>(count) * dtype_size(o.dtype));
  }
}

std::string format_row(const CommBenchRow& row) {
  char line[160];
  std::snprintf(line, sizeof(line), "%-15s %12lld %12lld %12.2f %12.3f %12.3f", row.op.c_str(),
                static_cast<long long>(row.bytes), static_cast<long long>(row.count), row.seconds * 1e6,
                row.algbw_gbps, row.busbw_gbps);
  return line;
}

}  // namespace

std::vector<std::string> comm_bench_ops() {
  return {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "memcpy"};
}

double bus_bandwidth_factor(const std::string& op, int ranks) {
  const double n = ranks;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return (n - 1) / n;
  if (op == "broadcast" || op == "reduce" || op == "memcpy") return 1.0;
  throw Error("bench comm: unknown op '" + op + "' (valid: " + join(comm_bench_ops()) + ")");
}

int64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string suffix = text.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && suffix.back() == 'B') suffix.pop_back();
  if (suffix.size() > 1 && suffix.back() == 'I') suffix.pop_back();
  const std::string valid = " (valid: a number of bytes with an optional K, M or G suffix, e.g. 8, 64K, 256M)";
  LOOM_CHECK(digits > 0 && digits <= 12, "bench comm: size '" + text + "' is not a size" + valid);
  int64_t value = std::stoll(text.substr(0, digits));
  if (suffix.empty() || suffix == "B") return value;
  if (suffix == "K") return value << 10;
  if (suffix == "M") return value << 20;
  if (suffix == "G") return value << 30;
  throw Error("bench comm: size '" + text + "' has an unknown suffix" + valid);
}

std::vector<CommBenchRow> run_comm_bench(Communicator& world, const CommBenchOptions& options, std::ostream* out) {
  const std::vector<std::string> valid = comm_bench_ops();
  for (const std::string& op : options.ops) {
    LOOM_CHECK(std::find(valid.begin(), valid.end(), op) != valid.end(),
          "bench comm: unknown op '" + op + "' (valid: " + join(valid) + ")");
  }
  LOOM_CHECK(options.min_bytes >= 1 && options.min_bytes <= options.max_bytes,
        "bench comm: sizes must satisfy 1 <= min-bytes <= max-bytes (got " + std::to_string(options.min_bytes) +
            " and " + std::to_string(options.max_bytes) + ")");
  LOOM_CHECK(options.iters >= 1 && options.warmup >= 0,
        "bench comm: iters must be >= 1 and warmup >= 0 (got " + std::to_string(options.iters) + " and " +
            std::to_string(options.warmup) + ")");
  if (world.backend() == "mpi") {
    MpiOptions mpi = mpi_options(world);
    mpi.check_agreement = options.check_agreement;
    set_mpi_options(world, mpi);
  }

  const int n = world.size();
  const size_t element = dtype_size(options.dtype);
  Buffers buffers;
  buffers.send = std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(options.max_bytes));
  buffers.recv = std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(options.max_bytes));
  // Zeros: sums stay finite however many iterations run, and every page is touched before timing.
  std::memset(buffers.send.get(), 0, static_cast<size_t>(options.max_bytes));
  std::memset(buffers.recv.get(), 0, static_cast<size_t>(options.max_bytes));

  if (out != nullptr) {
    *out << "# loom bench comm: backend " << world.backend() << ", " << n << " ranks, dtype "
         << dtype_name(options.dtype) << ", reduce " << reduce_op_name(options.reduce) << ", " << options.iters
         << " timed iterations after " << options.warmup << " warm-up";
    if (world.backend() == "mpi") *out << ", agreement checks " << (options.check_agreement ? "on" : "off");
    *out << "\n# time: slowest rank's mean per iteration; GB/s = 1e9 bytes/s; busbw as nccl-tests\n";
    *out << "# op                  size        count     time(us)  algbw(GB/s)  busbw(GB/s)\n" << std::flush;
  }

  std::vector<CommBenchRow> rows;
  for (const std::string& op : options.ops) {
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
      const int64_t count = count_for(op, bytes, element, n);
      if (count == 0) continue;
      for (int i = 0; i < options.warmup; ++i) run_once(world, op, buffers, count, options);
      world.barrier();
      const auto start = Clock::now();
      for (int i = 0; i < options.iters; ++i) run_once(world, op, buffers, count, options);
      float seconds = std::chrono::duration<float>(Clock::now() - start).count() / static_cast<float>(options.iters);
      world.all_reduce(&seconds, 1, DType::F32, ReduceOp::Max);

      CommBenchRow row;
      row.op = op;
      row.count = count;
      row.bytes = size_for(op, count, element, n);
      row.seconds = seconds;
      row.algbw_gbps = seconds > 0 ? static_cast<double>(row.bytes) / seconds / 1e9 : 0.0;
      row.busbw_gbps = row.algbw_gbps * bus_bandwidth_factor(op, n);
      rows.push_back(row);
      if (out != nullptr) *out << format_row(row) << "\n" << std::flush;
    }
  }
  return rows;
}

}  // namespace loom::comm
