// Two translation units including dlock.hpp link into one program (no
// duplicate definitions), share one error category object (codes made in
// either compare equal), and each sees the same inline functions.
// Built by scripts/test-cpp.sh with odr_b.cpp; -Wodr and LTO would flag a
// layout that differs between them.
#include <dlock.hpp>

#include <cstdio>

const std::error_category *category_b();
std::error_code fenced_b();
std::uint64_t admit_b(dlock::fence_gate &g);

int main() {
  int failed = 0;
  if (&dlock::category() != category_b()) {
    std::printf("FAIL: two category objects\n");
    ++failed;
  }
  if (fenced_b() != dlock::errc::fenced) {
    std::printf("FAIL: a code from the other unit compares unequal\n");
    ++failed;
  }
  dlock::fence_gate g;  // made here, used there
  if (admit_b(g) != 7 || g.highest("odr") != 7) {
    std::printf("FAIL: a gate shared across units\n");
    ++failed;
  }
  std::printf("cpp odr: %d passed, %d failed\n", 3 - failed, failed);
  return failed ? 1 : 0;
}
