#include "loom/core/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace loom {
namespace {

std::string bytes_from(int first, int step) {
  std::string bytes;
  for (int i = 0; i < 32; ++i) bytes.push_back(static_cast<char>(first + step * i));
  return bytes;
}

// The CRC catalogue's check value and RFC 3720's (iSCSI, appendix B.4) four 32-byte vectors.
TEST(Crc32c, MatchesThePublishedVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  EXPECT_EQ(crc32c(bytes_from(0, 1)), 0x46DD794Eu);
  EXPECT_EQ(crc32c(bytes_from(31, -1)), 0x113FDB5Cu);
}

TEST(Crc32c, TheMaskRotatesAndAddsTheConstant) {
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
  EXPECT_EQ(masked_crc32c(""), 0xA282EAD8u);
}

}  // namespace
}  // namespace loom
