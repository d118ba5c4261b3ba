#pragma once
// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF), the
// checksum of TensorBoard's event records; crc32c("123456789") = 0xE3069283.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom {

uint32_t crc32c(std::string_view bytes);

// TFRecord's masked form of a CRC-32C (stored checksums are masked so that a CRC over data that
// holds CRCs stays well distributed): rotate right by 15, add 0xA282EAD8.
uint32_t masked_crc32c(std::string_view bytes);

}  // namespace loom
