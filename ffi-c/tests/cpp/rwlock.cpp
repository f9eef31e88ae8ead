// dlock::rwlock (include/dlock.hpp) on the embedded backend: reader() and
// writer() give dlock::locks with mode(); readers on sessions of their own
// hold together and a writer waits; a writer excludes readers and plain
// locks; downgrade() keeps the token and lets a queued reader in; a plain
// lock's downgrade throws invalid_argument; fence_gate's two watermarks.
// Built by scripts/test-cpp.sh with -std=c++17 and c++20, strict, under
// ASan/UBSan. Prints `cpp rwlock: N passed, N failed`; exits non-zero on a
// failure (or killed by SIGALRM after 120 s).
#include <dlock.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <type_traits>
#include <utility>

#include "check.hpp"

using namespace std::chrono_literals;

static_assert(!std::is_copy_constructible_v<dlock::rwlock>);
static_assert(std::is_nothrow_move_constructible_v<dlock::rwlock>);
static_assert(std::is_nothrow_move_assignable_v<dlock::rwlock>);
static_assert(std::is_same_v<decltype(std::declval<dlock::rwlock &>().reader()), dlock::lock>);
static_assert(std::is_same_v<decltype(std::declval<dlock::lock &>().mode()), lk_mode>);

using dlock_test::quick;
using dlock_test::thrown;

static void readers_share_writers_exclude() {
  dlock::client c = dlock::client::memory();
  dlock::session a = c.session(quick()), b = c.session(quick()), w = c.session(quick());
  dlock::rwlock rw = a.rwlock("cpp/cfg");
  CHECK(rw.name() == "cpp/cfg");
  dlock::lock r1 = rw.reader();
  dlock::lock r2 = b.rwlock("cpp/cfg").reader();  // outlives its rwlock
  dlock::lock wr = w.rwlock("cpp/cfg").writer();
  CHECK(r1.mode() == LK_MODE_READ && wr.mode() == LK_MODE_WRITE);
  CHECK(c.lock("cpp/plain").mode() == LK_MODE_NONE);
  CHECK(r1.name() == "cpp/cfg");

  std::uint64_t t1 = r1.acquire(5s), t2 = r2.acquire(5s);
  CHECK(t2 > t1);
  CHECK(r1.state() == LK_STATE_HOLDING && r2.state() == LK_STATE_HOLDING);
  CHECK(thrown([&] { wr.acquire(0ms); }) == dlock::errc::would_block);
  CHECK(thrown([&] { wr.acquire(200ms); }) == dlock::errc::timeout);
  r1.release();
  r2.release();
  std::uint64_t tw = wr.acquire(5s);
  CHECK(tw > t2);

  // The writer excludes a reader and a plain lock (a writer).
  dlock::lock r3 = a.rwlock("cpp/cfg").reader();
  dlock::lock plain = b.lock("cpp/cfg");
  CHECK(thrown([&] { r3.acquire(0ms); }) == dlock::errc::would_block);
  CHECK(thrown([&] { plain.acquire(0ms); }) == dlock::errc::would_block);
  wr.release();
  CHECK(r3.acquire(0ms) > tw);

  dlock::rwlock moved = std::move(rw);
  CHECK(!rw && moved);
}

static void downgrade_keeps_the_token() {
  dlock::client c = dlock::client::memory();
  dlock::session a = c.session(quick()), b = c.session(quick());
  dlock::lock w = a.rwlock("cpp/cfg").writer();
  std::uint64_t token = w.acquire(5s);
  dlock::lock r = b.rwlock("cpp/cfg").reader();
  auto waiter = std::async(std::launch::async, [&] { return r.acquire(10s); });
  CHECK(waiter.wait_for(300ms) == std::future_status::timeout);  // behind the writer
  w.downgrade();
  CHECK(waiter.get() > token);
  CHECK(w.mode() == LK_MODE_READ);
  CHECK(w.token().value_or(0) == token);
  CHECK(w.state() == LK_STATE_HOLDING);
  w.downgrade();  // a reader's does nothing
  CHECK(w.token().value_or(0) == token);

  dlock::lock plain = c.lock("cpp/plain");
  plain.acquire(5s);
  CHECK(thrown([&] { plain.downgrade(); }) == dlock::errc::invalid_argument);
  CHECK(thrown([&] { a.rwlock("cpp/idle").writer().downgrade(); }) == dlock::errc::not_held);
  CHECK(thrown([&] { c.rwlock(std::string("a\0b", 3)); }) == dlock::errc::invalid_argument);
}

static void gate_watermarks() {
  dlock::fence_gate g;
  CHECK(g.watermarks("cfg") == std::make_pair(std::uint64_t{0}, std::uint64_t{0}));
  CHECK(g.admit_read("cfg", 5));
  CHECK(g.admit_read("cfg", 3));  // readers never refuse each other
  CHECK(!g.admit_write("cfg", 4));
  CHECK(g.admit_write("cfg", 7));
  CHECK(!g.admit_read("cfg", 6));
  CHECK(g.admit_read("cfg", 8));
  CHECK(g.watermarks("cfg") == std::make_pair(std::uint64_t{7}, std::uint64_t{8}));
  CHECK(!g.admit("cfg", 7));  // admit is a write
}

int main() {
  alarm(120);
  readers_share_writers_exclude();
  downgrade_keeps_the_token();
  gate_watermarks();
  std::printf("cpp rwlock (C++%ld): %d passed, %d failed\n", __cplusplus / 100 % 100, passed, failed);
  return failed ? 1 : 0;
}
