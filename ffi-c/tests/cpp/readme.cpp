// README.md's C++ worker loop as written (issue 32, item 9): the block
// between the README markers is README.md's `## C++` block, line for line
// (core/tests/readme.rs holds them equal; its `#include <dlock.hpp>` is a
// no-op there, the header being included above). Run on the embedded
// backend (DLOCK_ENDPOINTS unset) 30 times, each fenced at its third unit
// (its lock key deleted, the default reacquire): the loop stops as its
// comment says, no unit of work under the new token, within 20 s (alarm).
// The section's second ```cpp block, the election, lives here too between
// the `README election` markers: main holds its text equal to README.md's
// (read at run time from the repository root, where scripts/test-cpp.sh
// runs it) and runs it: the observer follows the leader, the leader works
// until it stops, then resigns.
// Prints `cpp readme: N passed, N failed`; exits non-zero on a failure.
#include <dlock.hpp>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"

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

// The election block's hooks: what the observer followed, the rounds led.
static std::mutex followed_m;
static std::condition_variable followed_cv;
static std::vector<std::string> followed;
static int rounds;

static void follow(const std::string &value) {
  std::lock_guard<std::mutex> g(followed_m);
  followed.push_back(value);
  followed_cv.notify_all();
}

// Three rounds of leader work, then the leader stops on its own. The
// first waits (up to 10 s) until the observer followed this leader: the
// observer starts its watch on its own thread, and a leader gone before
// its first read is never reported (only who leads when it looks).
static bool lead_one_round(std::uint64_t) {
  if (rounds == 0) {
    std::unique_lock<std::mutex> g(followed_m);
    followed_cv.wait_for(g, std::chrono::seconds(10), [] { return !followed.empty(); });
  }
  return ++rounds < 3;
}

static void readme_election() {
  dlock::client client = dlock::client::from_env();
  // README election: begin (README.md, `## C++`, the second ```cpp block)
  dlock::observer observer = client.observe("scheduler", [](const dlock::observed &e) {
    if (e.leader) follow(e.leader->value);            // each new leader or value, on the observer's thread
  });

  dlock::election election = client.election("scheduler");
  std::uint64_t term = election.campaign("node-1", std::chrono::seconds(30)); // throws dlock::error (timeout, ...)
  while (dlock::permit permit = election.permit()) {  // leader work, as with a lock
    if (permit.token() != term || !lead_one_round(permit.token())) break;
  }
  election.resign();                                  // the next leader starts once this work has ended
  // README election: end
  CHECK(rounds == 3);              // it led until it stopped
  CHECK(!election.leader());       // and nobody leads after the resign
  std::lock_guard<std::mutex> g(followed_m);
  CHECK(!followed.empty() && followed[0] == "node-1");  // the observer followed it
}

// The `README election` region of this file, two spaces of indent off.
static std::string election_region() {
  std::ifstream f(__FILE__);
  std::string line, out;
  bool inside = false;
  while (std::getline(f, line)) {
    if (line.find("README election: begin") != std::string::npos) {
      inside = true;
    } else if (line.find("README election: end") != std::string::npos) {
      break;
    } else if (inside) {
      out += (line.rfind("  ", 0) == 0 ? line.substr(2) : line) + "\n";
    }
  }
  return out;
}

// The second ```cpp block under README.md's `## C++`; empty when missing.
static std::string readme_election_block() {
  std::ifstream f("README.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::size_t at = text.find("\n## C++\n");
  if (at == std::string::npos) return "";
  const std::size_t end = text.find("\n## ", at + 1);
  const std::string section = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
  const std::string fence = "```cpp\n";
  at = section.find(fence);
  if (at != std::string::npos) at = section.find(fence, at + fence.size());
  if (at == std::string::npos) return "";
  at += fence.size();
  const std::size_t close = section.find("```", at);
  return close == std::string::npos ? "" : section.substr(at, close - at);
}

int main() {
  unsetenv("DLOCK_ENDPOINTS"); // the embedded backend
  const std::string here = election_region(), there = readme_election_block();
  CHECK(!here.empty());
  CHECK(here == there);
  if (here != there)
    std::printf("README.md's second C++ block and readme.cpp's `README election` region differ:\n--- README.md\n%s--- %s\n%s",
                there.c_str(), __FILE__, here.c_str());
  readme_election();
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
