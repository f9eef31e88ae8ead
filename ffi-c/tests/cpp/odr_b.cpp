// The second translation unit of the ODR test (odr_a.cpp).
#include <dlock.hpp>

const std::error_category *category_b() { return &dlock::category(); }
std::error_code fenced_b() { return dlock::errc::fenced; }
std::uint64_t admit_b(dlock::fence_gate &g) {
  g.admit("odr", 7);
  return g.highest("odr");
}
