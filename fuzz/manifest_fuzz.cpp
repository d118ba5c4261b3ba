// libFuzzer target: the checkpoint manifest parser (ckpt/manifest.h) on arbitrary text. Each
// input is parsed as given (bad JSON, bad checksums) and, when it is a JSON object, once more
// with its manifest_xxh3 set to the right value, so the fuzzer also reaches the structural
// checks behind the checksum. Only a loom::Error may come out; an accepted manifest must
// serialize and parse back to the same manifest.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loom/ckpt/manifest.h"
#include "loom/core/error.h"

namespace {

void parse_and_check(std::string_view text) {
  loom::ckpt::Manifest manifest;
  try {
    manifest = loom::ckpt::parse_manifest(text, "fuzz/manifest.json");
  } catch (const loom::Error&) {
    return;
  }
  std::string again;
  try {
    again = loom::ckpt::serialize_manifest(manifest);
  } catch (const loom::Error&) {
    return;  // e.g. a state the writer refuses; not a parser bug
  }
  const loom::ckpt::Manifest reparsed = loom::ckpt::parse_manifest(again, "fuzz/manifest.json (rewritten)");
  if (loom::ckpt::serialize_manifest(reparsed) != again) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  parse_and_check(text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return 0;
  j.erase("manifest_xxh3");
  const std::string body = j.dump();
  j["manifest_xxh3"] = loom::ckpt::hex64(XXH3_64bits(body.data(), body.size()));
  parse_and_check(j.dump());
  return 0;
}
