// An NVTX tool for tests: loaded by NVTX_INJECTION64_PATH as Nsight Systems' is, it writes every
// domain range push and pop to the file LOOM_NVTX_RECORD names, one line each ("push <domain>
// <message>", "pop <domain>"), so a test sees what a profiler would be told. NVTX's tool
// interface: InitializeInjectionNvtx2 fills the core module's function table.
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;
FILE* g_out = nullptr;

void record(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out == nullptr) return;
  std::fprintf(g_out, "%s\n", line.c_str());
  std::fflush(g_out);
}

// A domain handle is its name, kept for the process's life.
const char* domain_name(nvtxDomainHandle_t domain) {
  return domain == nullptr ? "(default)" : reinterpret_cast<const std::string*>(domain)->c_str();
}

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  return reinterpret_cast<nvtxDomainHandle_t>(new std::string(name));
}

int NVTX_API range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attributes) {
  const bool ascii = attributes != nullptr && attributes->messageType == NVTX_MESSAGE_TYPE_ASCII;
  record(std::string("push ") + domain_name(domain) + " " + (ascii ? attributes->message.ascii : "(no ascii message)"));
  return 0;
}

int NVTX_API range_pop(nvtxDomainHandle_t domain) {
  record(std::string("pop ") + domain_name(domain));
  return 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const char* path = std::getenv("LOOM_NVTX_RECORD");
  if (path == nullptr || get_table == nullptr) return 0;
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr || callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0) return 0;
  if (size <= NVTX_CBID_CORE2_DomainCreateA) return 0;
  g_out = std::fopen(path, "a");  // appended: another NVTX copy in the process may initialise too
  if (g_out == nullptr) return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  return 1;
}
