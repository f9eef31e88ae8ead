// README.md's C++ worker loop as written (issue 32, item 9): the block
// between the README markers is README.md's `## C++` block, line for line
// (core/tests/readme.rs holds them equal; its `#include <dlock.hpp>` is a
// no-op there, the header being included above). Run on the embedded
// backend (DLOCK_ENDPOINTS unset) 30 times, each fenced at its third unit
// (its lock key deleted, the default reacquire): the loop stops as its
// comment says, no unit of work under the new token, within 20 s (alarm).
// Prints `cpp readme: N passed, N failed`; exits non-zero on a failure.
#include <dlock.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

static int passed, failed;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (cond) {                                                       \
      ++passed;                                                       \
    } else {                                                          \
      ++failed;                                                       \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
    }                                                                 \
  } while (0)

static std::vector<std::uint64_t> units;
static int fences;

static void die(const char *msg) {
  std::printf("FAIL: %s\n", msg);
  std::exit(1);
}

static void stop_everything() { fences++; }

// One unit of work; the third is fenced: an operator deletes the lock key
// and the lock reacquires (the service's holder is then the new token).
static void do_one_unit(std::uint64_t t) {
  if (units.size() >= 50) die("the loop did not stop at the fence");
  units.push_back(t);
  if (units.size() == 3) {
    struct lk_memory *memory = nullptr;
    if (lk_memory_named("", &memory) != LK_OK) die(lk_last_error());
    if (lk_memory_delete_lock_key(memory, "orders") != LK_OK) die("delete_lock_key");
    for (int i = 0;; i++) {
      std::uint64_t holder = 0;
      if (lk_memory_holder(memory, "orders", &holder) == LK_OK && holder != t) break;
      if (i > 10000) die("no reacquisition after the fence");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    lk_memory_free(memory);
  }
}

static void commit() {}

static void readme() {
  // README: begin (README.md, `## C++`, the first ```cpp block)
  #include <dlock.hpp>

  dlock::client client = dlock::client::from_env();   // embedded, or etcd with DLOCK_ENDPOINTS
  dlock::lock lock = client.lock("orders");
  lock.on_fence([&](uint64_t, uint64_t) { stop_everything(); });
  std::uint64_t token = lock.acquire(std::chrono::seconds(10)); // throws dlock::error (code(): dlock::errc::timeout, ...)

  while (dlock::permit permit = lock.permit()) {      // refused: permit.status() == dlock::errc::draining, ...
    if (permit.token() != token) break;               // fenced and acquired again meanwhile: stop too
    do_one_unit(permit.token());                      // every write carries the token
    if (permit.valid()) commit();                     // re-reads the clock
  }                                                   // each permit ends in its destructor
  // README: end
}

int main() {
  unsetenv("DLOCK_ENDPOINTS"); // the embedded backend
  alarm(20);                   // the loop stops within the bound, or SIGALRM fails the run
  for (int run = 0; run < 30; run++) {
    units.clear();
    fences = 0;
    readme();
    bool same = true;
    for (auto t : units) same = same && t == units[0];
    if (units.size() != 3 || !same) std::printf("run %d: %zu units\n", run, units.size());
    CHECK(units.size() == 3);  // no unit after the fence
    CHECK(same);               // none under the new token
    CHECK(fences == 1);        // the fence handler ran
  }
  std::printf("cpp readme: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
