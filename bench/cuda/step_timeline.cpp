// A minimal GPU timeline of an unmodified CUDA process: a CUPTI injection library that records
// which kernels, copies and sets the GPU ran when, the synchronisations, and the host's CUDA
// runtime calls with their start and end, and writes them as one CSV at process exit. Nsight
// Systems does not run on the lent GPU machine; this tells where a training step leaves the GPU
// idle (the host launching, or waiting in a synchronisation) beside Nsight Compute's per-kernel
// times. bench/cuda/step_timeline.py cuts the CSV into steps and lists the gaps.
//   CUDA_INJECTION64_PATH=/path/libloom_step_timeline.so loom train ...
// The CUDA driver loads the library during cuInit and calls InitializeInjection.
// Environment:
//   LOOM_TIMELINE_OUT      the CSV (default loom_timeline.csv in the working directory), written
//                          at exit as PATH.tmp and renamed
//   LOOM_TIMELINE_START_S  keep only records that start this many seconds after the injection or
//                          later (leaves warm-up out of memory)
//   LOOM_TIMELINE_DRIVER=1 also the driver API's calls (kind "driver"; about doubles the records)
// CSV columns: kind,name,start_ns,end_ns,stream,correlation. kind: kernel, memcpy, memset, sync,
// runtime or driver. name: the demangled kernel name; "memcpy HtoD 4096 B"; "memset 4096 B"; the
// synchronisation's type; the API function's name. stream: the GPU stream, for sync records the
// stream waited on (empty when none), for runtime and driver records the host thread's id.
// correlation: CUPTI's correlation id (an API call and the work it launched share it). Times are
// CUPTI's nanoseconds: GPU timestamps converted to the host clock CUPTI takes its API records'
// times from, so GPU and host records compare directly. Lines starting with '#' are comments: the
// records dropped over the 2 million cap, dropped by CUPTI, skipped by LOOM_TIMELINE_START_S, or
// left without an end at exit. A CUPTI call that fails prints one line to stderr; where setting up
// fails, the recording is off (no CSV). The process itself runs on unharmed either way.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kBufferAlignment = 8;  // CUPTI's activity records need 8-byte aligned buffers
constexpr size_t kMaxRecords = 2'000'000;
constexpr uint32_t kNoStream = CUPTI_SYNCHRONIZATION_INVALID_VALUE;

enum class RecordKind : uint8_t { kernel, memcpy, memset, sync, runtime, driver };

const char* kind_name(RecordKind kind) {
  switch (kind) {
    case RecordKind::kernel: return "kernel";
    case RecordKind::memcpy: return "memcpy";
    case RecordKind::memset: return "memset";
    case RecordKind::sync: return "sync";
    case RecordKind::runtime: return "runtime";
    case RecordKind::driver: return "driver";
  }
  return "unknown";
}

// One record as kept: names are interned (a step repeats the same few hundred).
struct TimelineRecord {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint64_t bytes = 0;  // memcpy and memset only
  uint32_t name_id = 0;
  uint32_t stream = kNoStream;
  uint32_t correlation = 0;
  RecordKind kind = RecordKind::kernel;
};

struct Timeline {
  std::mutex mutex;  // buffers complete on CUPTI's thread and on the thread that flushes
  std::vector<TimelineRecord> records;
  std::vector<std::string> names;
  std::unordered_map<std::string, uint32_t> name_ids;
  std::unordered_map<uint64_t, uint32_t> api_name_ids;  // (domain << 32 | cbid): interned name
  uint64_t dropped_over_cap = 0;
  uint64_t dropped_by_cupti = 0;
  uint64_t skipped_before_start = 0;
  uint64_t incomplete = 0;  // delivered by the forced flush at exit before they ended
  uint64_t keep_from_ns = 0;
  bool next_record_error_reported = false;
  std::atomic<bool> collecting{false};
  std::string out_path;
};

// Never destroyed: the exit handler must find it whatever order static destructors run in.
Timeline& timeline() {
  static Timeline* const instance = new Timeline;
  return *instance;
}

// True when the call succeeded; else one line to stderr naming the call and CUPTI's reason.
bool cupti_ok(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return true;
  const char* reason = nullptr;
  if (cuptiGetResultString(result, &reason) != CUPTI_SUCCESS || reason == nullptr) reason = "unknown error";
  std::fprintf(stderr, "loom step timeline: %s failed: %s\n", call, reason);
  return false;
}

uint32_t intern(Timeline& t, std::string_view name) {
  auto found = t.name_ids.find(std::string(name));
  if (found != t.name_ids.end()) return found->second;
  const auto id = static_cast<uint32_t>(t.names.size());
  t.names.emplace_back(name);
  t.name_ids.emplace(t.names.back(), id);
  return id;
}

// An API function's name without CUPTI's version suffix: "cudaLaunchKernel_v7000" -> "cudaLaunchKernel".
std::string api_function_name(CUpti_CallbackDomain domain, uint32_t cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || name == nullptr) {
    return (domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime cbid " : "driver cbid ") + std::to_string(cbid);
  }
  std::string text(name);
  const size_t suffix = text.rfind("_v");
  if (suffix != std::string::npos && suffix + 2 < text.size() &&
      text.find_first_not_of("0123456789", suffix + 2) == std::string::npos) {
    text.resize(suffix);
  }
  return text;
}

uint32_t api_name_id(Timeline& t, CUpti_CallbackDomain domain, uint32_t cbid) {
  const uint64_t key = (uint64_t{static_cast<uint32_t>(domain)} << 32) | cbid;
  auto found = t.api_name_ids.find(key);
  if (found != t.api_name_ids.end()) return found->second;
  const uint32_t id = intern(t, api_function_name(domain, cbid));
  t.api_name_ids.emplace(key, id);
  return id;
}

const char* copy_kind_name(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "unknown";
  }
}

const char* sync_type_name(CUpti_ActivitySynchronizationType type) {
  switch (type) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "event synchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "stream wait event";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "stream synchronize";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "context synchronize";
    default: return "unknown synchronize";
  }
}

// Keeps one record unless it has no times (CUPTI could not time it), has not ended, starts before
// LOOM_TIMELINE_START_S, or the cap is reached.
void keep(Timeline& t, TimelineRecord record) {
  if (record.start_ns == 0 && record.end_ns == 0) return;
  if (record.end_ns < record.start_ns) {
    ++t.incomplete;
  } else if (record.start_ns < t.keep_from_ns) {
    ++t.skipped_before_start;
  } else if (t.records.size() >= kMaxRecords) {
    ++t.dropped_over_cap;
  } else {
    t.records.push_back(record);
  }
}

// One CUPTI record into the timeline (the caller holds the mutex). The casts follow the record
// structures cupti_activity.h names for each kind in this CUPTI (13.x).
void keep_activity(Timeline& t, const CUpti_Activity* activity) {
  TimelineRecord record;
  switch (activity->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(activity);
      record = {kernel->start, kernel->end, 0, intern(t, kernel->name ? kernel->name : "(unnamed kernel)"),
                kernel->streamId, kernel->correlationId, RecordKind::kernel};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(activity);
      record = {copy->start, copy->end, copy->bytes, intern(t, std::string("memcpy ") + copy_kind_name(copy->copyKind)),
                copy->streamId, copy->correlationId, RecordKind::memcpy};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(activity);
      record = {set->start, set->end, set->bytes, intern(t, "memset"), set->streamId, set->correlationId,
                RecordKind::memset};
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const auto* sync = reinterpret_cast<const CUpti_ActivitySynchronization2*>(activity);
      record = {sync->start, sync->end, 0, intern(t, sync_type_name(sync->type)), sync->streamId,
                sync->correlationId, RecordKind::sync};
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* call = reinterpret_cast<const CUpti_ActivityAPI*>(activity);
      const bool runtime = activity->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
      const auto domain = runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
      record = {call->start, call->end, 0, api_name_id(t, domain, call->cbid), call->threadId, call->correlationId,
                runtime ? RecordKind::runtime : RecordKind::driver};
      break;
    }
    default:
      return;  // a kind not enabled here
  }
  keep(t, record);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // no buffer: CUPTI drops records and counts them
  *max_records = 0;                                // as many as fit
}

// Copies a completed buffer's records out and frees it (CUPTI's buffers are not kept).
void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid_size) {
  Timeline& t = timeline();
  {
    std::lock_guard lock(t.mutex);
    if (t.collecting.load()) {
      CUpti_Activity* activity = nullptr;
      for (;;) {
        const CUptiResult status = cuptiActivityGetNextRecord(buffer, valid_size, &activity);
        if (status == CUPTI_SUCCESS) {
          keep_activity(t, activity);
          continue;
        }
        // The end of the buffer; anything else ends it too (an incomplete record after a forced
        // flush), said once.
        if (status != CUPTI_ERROR_MAX_LIMIT_REACHED && !t.next_record_error_reported) {
          t.next_record_error_reported = !cupti_ok(status, "cuptiActivityGetNextRecord");
        }
        break;
      }
      size_t dropped = 0;
      if (cupti_ok(cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped),
                   "cuptiActivityGetNumDroppedRecords") && dropped > 0) {
        t.dropped_by_cupti += dropped;
        std::fprintf(stderr, "loom step timeline: CUPTI dropped %zu records (buffer of %zu bytes)\n", dropped,
                     valid_size);
      }
    }
  }
  std::free(buffer);
}

void write_csv_field(std::FILE* file, std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) {
    std::fwrite(text.data(), 1, text.size(), file);
    return;
  }
  std::fputc('"', file);
  for (const char c : text) {
    if (c == '"') std::fputc('"', file);
    std::fputc(c, file);
  }
  std::fputc('"', file);
}

// A kernel's demangled name; the name as CUPTI gave it where it is not a mangled C++ name (only
// "_Z" names are tried: a short C name such as "x" would demangle as a type, "long long").
std::string demangled(const std::string& name) {
  if (!name.starts_with("_Z")) return name;
  int status = 0;
  char* text = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string result = status == 0 && text != nullptr ? std::string(text) : name;
  std::free(text);
  return result;
}

// The records, by start time, as PATH.tmp renamed to PATH once complete.
bool write_csv(Timeline& t) {
  std::sort(t.records.begin(), t.records.end(),
            [](const TimelineRecord& a, const TimelineRecord& b) { return a.start_ns < b.start_ns; });
  std::vector<std::string> kernel_names(t.names.size());  // each kernel name demangled once
  const std::string tmp_path = t.out_path + ".tmp";
  std::FILE* file = std::fopen(tmp_path.c_str(), "w");
  if (file == nullptr) {
    std::fprintf(stderr, "loom step timeline: cannot write %s: %s\n", tmp_path.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(file, "# dropped %" PRIu64 " records\n", t.dropped_over_cap);
  std::fprintf(file, "# cupti dropped %" PRIu64 " records\n", t.dropped_by_cupti);
  std::fprintf(file, "# skipped %" PRIu64 " records before LOOM_TIMELINE_START_S\n", t.skipped_before_start);
  std::fprintf(file, "# incomplete %" PRIu64 " records (no end at exit)\n", t.incomplete);
  std::fputs("kind,name,start_ns,end_ns,stream,correlation\n", file);
  for (const TimelineRecord& record : t.records) {
    std::string name = t.names[record.name_id];
    if (record.kind == RecordKind::kernel) {
      std::string& cached = kernel_names[record.name_id];
      if (cached.empty()) cached = demangled(name);
      name = cached;
    } else if (record.kind == RecordKind::memcpy || record.kind == RecordKind::memset) {
      name.append(" ").append(std::to_string(record.bytes)).append(" B");
    }
    std::fprintf(file, "%s,", kind_name(record.kind));
    write_csv_field(file, name);
    std::fprintf(file, ",%" PRIu64 ",%" PRIu64 ",", record.start_ns, record.end_ns);
    if (record.stream != kNoStream) std::fprintf(file, "%" PRIu32, record.stream);
    std::fprintf(file, ",%" PRIu32 "\n", record.correlation);
  }
  const bool written = std::fflush(file) == 0 && !std::ferror(file);
  if (std::fclose(file) != 0 || !written || std::rename(tmp_path.c_str(), t.out_path.c_str()) != 0) {
    std::fprintf(stderr, "loom step timeline: writing %s failed: %s\n", t.out_path.c_str(), std::strerror(errno));
    std::remove(tmp_path.c_str());
    return false;
  }
  return true;
}

// At exit: the buffers CUPTI still holds (forced: also those with records still incomplete),
// then the CSV. The flush may fail when the CUDA context is already gone; the records already
// delivered are written all the same.
void write_timeline_at_exit() {
  Timeline& t = timeline();
  if (!t.collecting.load()) return;
  cupti_ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard lock(t.mutex);
  t.collecting.store(false);  // buffers completing from here on are freed unread
  if (write_csv(t)) {
    std::fprintf(stderr, "loom step timeline: %zu records in %s\n", t.records.size(), t.out_path.c_str());
  }
}

struct TracedKind {
  CUpti_ActivityKind kind;
  const char* enable_call;  // for the failure's line
};
const TracedKind kTracedKinds[] = {
    {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)"},
    {CUPTI_ACTIVITY_KIND_MEMCPY, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY)"},
    {CUPTI_ACTIVITY_KIND_MEMSET, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET)"},
    {CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)"},
    {CUPTI_ACTIVITY_KIND_RUNTIME, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME)"},
    {CUPTI_ACTIVITY_KIND_DRIVER, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER)"},
};

bool driver_calls_wanted() {
  const char* value = std::getenv("LOOM_TIMELINE_DRIVER");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// Turns off what setup turned on, after a failure (errors ignored: it is already failing).
void stop_tracing() {
  timeline().collecting.store(false);
  for (const TracedKind& traced : kTracedKinds) cuptiActivityDisable(traced.kind);
}

// Where the CSV goes (absolute: the process may change directory before it exits) and from when on
// records are kept.
bool read_settings(Timeline& t) {
  const char* out = std::getenv("LOOM_TIMELINE_OUT");
  t.out_path = out != nullptr && *out != '\0' ? out : "loom_timeline.csv";
  if (t.out_path.front() != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd) != nullptr) t.out_path = std::string(cwd) + "/" + t.out_path;
  }
  const char* start = std::getenv("LOOM_TIMELINE_START_S");
  if (start == nullptr || *start == '\0') return true;
  char* end = nullptr;
  const double seconds = std::strtod(start, &end);
  if (*end != '\0' || !(seconds >= 0)) {
    std::fprintf(stderr, "loom step timeline: LOOM_TIMELINE_START_S=%s is not a number of seconds; ignored\n",
                 start);
    return true;
  }
  uint64_t now_ns = 0;
  if (!cupti_ok(cuptiGetTimestamp(&now_ns), "cuptiGetTimestamp")) return false;
  t.keep_from_ns = now_ns + static_cast<uint64_t>(seconds * 1e9);
  return true;
}

// The records this library reads are laid out as this CUPTI's headers say: a CUPTI of another
// major version (other record structures) is refused.
bool same_cupti_major_version() {
  uint32_t version = 0;
  if (!cupti_ok(cuptiGetVersion(&version), "cuptiGetVersion")) return false;
  if (version / 10000 == CUPTI_API_VERSION / 10000) return true;
  std::fprintf(stderr, "loom step timeline: CUPTI API version %u loaded, built for %u; not tracing\n", version,
               CUPTI_API_VERSION);
  return false;
}

bool start_tracing() {
  Timeline& t = timeline();
  if (!same_cupti_major_version() || !read_settings(t)) return false;
  if (!cupti_ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
                "cuptiActivityRegisterCallbacks")) {
    return false;
  }
  t.collecting.store(true);
  const bool driver = driver_calls_wanted();
  for (const TracedKind& traced : kTracedKinds) {
    if (traced.kind == CUPTI_ACTIVITY_KIND_DRIVER && !driver) continue;
    if (!cupti_ok(cuptiActivityEnable(traced.kind), traced.enable_call)) return false;
  }
  return true;
}

}  // namespace

// The CUDA driver's entry point for a library named by CUDA_INJECTION64_PATH, called once during
// cuInit. Returns 1 also when tracing could not start: the process goes on without it.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::atomic<bool> initialized{false};
  if (initialized.exchange(true)) return 1;
  if (!start_tracing()) {
    stop_tracing();
    std::fprintf(stderr, "loom step timeline: off, no timeline will be written\n");
    return 1;
  }
  if (std::atexit(write_timeline_at_exit) != 0) {
    stop_tracing();
    std::fprintf(stderr, "loom step timeline: atexit failed; off, no timeline will be written\n");
  }
  return 1;
}
