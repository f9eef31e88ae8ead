// dlock::semaphore (include/dlock.hpp) on the embedded backend: N + 1
// contenders on sessions of their own, exactly N hold, each on a distinct
// slot, a held dlock::lock with slot(); try_acquire gives std::nullopt and
// acquire throws timeout when every slot is held; a release (the lock's
// destructor) wakes the waiter onto that slot with a higher token; the
// limit mismatch, 0 and over the maximum throw invalid_argument; a plain
// lock has no slot. Built by scripts/test-cpp.sh with -std=c++17 and
// c++20, strict, under ASan/UBSan. Prints `cpp semaphore: N passed, N
// failed`; exits non-zero on a failure (or killed by SIGALRM after 120 s).
#include <dlock.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "check.hpp"

using namespace std::chrono_literals;

static_assert(!std::is_copy_constructible_v<dlock::semaphore>);
static_assert(std::is_nothrow_move_constructible_v<dlock::semaphore>);
static_assert(std::is_nothrow_move_assignable_v<dlock::semaphore>);
static_assert(std::is_same_v<decltype(std::declval<dlock::semaphore &>().acquire(1s)), dlock::lock>);

using dlock_test::quick;
using dlock_test::thrown;

constexpr std::uint32_t N = 3;

static void n_of_n_plus_one() {
  dlock::client c = dlock::client::memory();
  std::vector<dlock::session> sessions;
  std::vector<dlock::semaphore> sems;
  for (std::uint32_t i = 0; i <= N; ++i) {
    sessions.push_back(c.session(quick()));
    sems.push_back(sessions.back().semaphore("cpp/gpu", N));
  }
  CHECK(sems[0].limit() == N);
  CHECK(sems[0].name() == "cpp/gpu");

  std::vector<dlock::lock> held;
  std::set<std::uint32_t> slots;
  for (std::uint32_t i = 0; i < N; ++i) {
    held.push_back(sems[i].acquire(5s));
    auto slot = held.back().slot();
    CHECK(slot.has_value() && *slot < N);
    if (slot) {
      slots.insert(*slot);
      CHECK(held.back().name() == "cpp/gpu/slot/" + std::to_string(*slot));
    }
    CHECK(held.back().state() == LK_STATE_HOLDING);
    dlock::permit p = held.back().permit();
    CHECK(static_cast<bool>(p) && p.token() == held.back().token());
  }
  CHECK(slots.size() == N);  // distinct slots

  // The (N+1)-th: every slot held.
  dlock::semaphore &last = sems[N];
  CHECK(!last.try_acquire().has_value());
  CHECK(thrown([&] { last.acquire(0ms); }) == dlock::errc::would_block);
  CHECK(thrown([&] { last.acquire(200ms); }) == dlock::errc::timeout);
  CHECK(thrown([&] { last.acquire(-1ms); }) == dlock::errc::invalid_argument);

  // A release (the lock's destructor) wakes the waiter onto that slot.
  auto waiter = std::async(std::launch::async, [&] { return last.acquire(10s); });
  CHECK(waiter.wait_for(300ms) == std::future_status::timeout);
  std::uint32_t freed = held[1].slot().value_or(N);
  std::uint64_t old_token = held[1].token().value_or(0);
  held.erase(held.begin() + 1);
  dlock::lock got = waiter.get();
  CHECK(got.slot() == freed);
  CHECK(got.token().value_or(0) > old_token);  // tokens rise per slot
}

static void limits_and_plain_locks() {
  dlock::client c = dlock::client::memory();
  dlock::semaphore s = c.semaphore("cpp/limits", 2);
  CHECK(thrown([&] { c.semaphore("cpp/limits", 3); }) == dlock::errc::invalid_argument);
  try {
    c.semaphore("cpp/limits", 3);
  } catch (const dlock::error &e) {
    std::string what = e.what();
    CHECK(what.find("limit 2") != std::string::npos && what.find("not 3") != std::string::npos);
  }
  CHECK(thrown([&] { c.semaphore("cpp/zero", 0); }) == dlock::errc::invalid_argument);
  CHECK(thrown([&] { c.semaphore("cpp/big", LK_MAX_SEMAPHORE_LIMIT + 1); }) == dlock::errc::invalid_argument);
  CHECK(thrown([&] { c.semaphore(std::string("a\0b", 3), 1); }) == dlock::errc::invalid_argument);

  dlock::lock plain = c.lock("cpp/plain");
  CHECK(!plain.slot().has_value());
  dlock::semaphore moved = std::move(s);
  CHECK(!s && moved);
  std::optional<dlock::lock> one = moved.try_acquire();
  CHECK(one.has_value() && one->slot().has_value());
}

int main() {
  alarm(120);
  n_of_n_plus_one();
  limits_and_plain_locks();
  std::printf("cpp semaphore (C++%ld): %d passed, %d failed\n", __cplusplus / 100 % 100, passed, failed);
  return failed ? 1 : 0;
}
