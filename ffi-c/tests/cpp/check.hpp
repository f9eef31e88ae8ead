// The harness the C++ tests share: CHECK and its tally (../c/tally.h, the
// C README test's too); quick(), the embedded tests' short timings;
// thrown(), the status a call threw.
#ifndef DLOCK_TEST_CHECK_HPP
#define DLOCK_TEST_CHECK_HPP

#include <dlock.hpp>

#include <chrono>

#include "../c/tally.h"

namespace dlock_test {

// Short timings (the rules: ttl >= 2000 and > keepalive_interval + margin).
inline dlock::options quick() {
  using namespace std::chrono_literals;
  dlock::options o;
  o.ttl = 2s;
  o.keepalive_interval = 500ms;
  o.keepalive_timeout = 200ms;
  o.retry_interval = 100ms;
  o.margin = 500ms;
  return o;
}

// The status a call threw, errc::ok if none.
template <class F>
dlock::errc thrown(F f) {
  try {
    f();
  } catch (const dlock::error &e) {
    return e.status();
  }
  return dlock::errc::ok;
}

}  // namespace dlock_test

#endif
