// SHA-256 (FIPS 180-4), small and dependency-free: the kernel cache hashes its
// keys and checks the payload of every file it reads with it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flashjit::compiler {

using Digest = std::array<uint8_t, 32>;

/// Incremental hashing: update() any number of times, then finish() once.
class Sha256 {
public:
  Sha256();
  void update(const void *data, size_t size);
  void update(std::string_view text) { update(text.data(), text.size()); }
  Digest finish();

private:
  void block(const uint8_t *p);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0; // bytes hashed so far
};

Digest sha256(const void *data, size_t size);
inline Digest sha256(std::string_view text) { return sha256(text.data(), text.size()); }

/// Lowercase hex of `size` bytes.
std::string to_hex(const uint8_t *bytes, size_t size);
inline std::string to_hex(const Digest &d) { return to_hex(d.data(), d.size()); }
/// Lowercase hex SHA-256 of `text`.
inline std::string sha256_hex(std::string_view text) { return to_hex(sha256(text)); }

} // namespace flashjit::compiler
