// The packet generator of the differential fuzzer (fuzz_test.cpp): seeded
// and deterministic (the same seed gives the same frames on any machine),
// it makes valid, near-valid and garbage frames aimed at one pod program:
// IPv4 and IPv6, IPv4 options, IPv6 extension chains (hop-by-hop, routing,
// destination options, AH, fragment, unknown), fragments (first, later,
// atomic), every TCP flag combination, UDP (DNS port 53 included), ICMP,
// other protocols, truncation at every length, wrong versions, IHLs, data
// offsets and lengths, odd ethertypes, flipped bytes, and the addresses and
// ports the rules single out (pod, resolver, probe source, loopback, the
// proxy's ports 15001/15006/15008/15053).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "test/bpf/harness.h"
#include "test/common/packet.h"

namespace sluice::test::fuzz {

/// One generated input: the frame and the ctx mark it is run with.
struct Input {
  Bytes frame;
  uint32_t mark = 0;
};

/// Deterministic generator for one program.
class Generator {
 public:
  Generator(uint64_t seed, Prog prog) : rng_(seed), prog_(prog) {}

  /// The next frame and mark: 2% garbage behind an IP (or any) ethertype,
  /// the rest built field by field and then, now and then, given another
  /// protocol, a wrong length field, flipped bits, a cut or trailing bytes.
  Input next();

  /// A uniformly drawn integer in [0, n).
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }
  bool chance(unsigned percent) { return below(100) < percent; }
  /// An address of the family from the pool the rules single out.
  std::string address(bool v4);
  /// A port from the pool the rules single out, or any.
  uint16_t port();

 private:
  Packet structured(bool v4);  // a frame aimed at prog_, before byte-level damage
  uint32_t mark();             // the ctx mark: the marks prog_ reads, and random ones

  std::mt19937_64 rng_;
  Prog prog_;
};

}  // namespace sluice::test::fuzz
