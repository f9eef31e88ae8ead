// The C++ player of scenarios/vectors/bad_input.json: every case dlock.hpp
// can express throws dlock::error with the vector's code (decided by the
// core; dlock.hpp only converts), the others are skipped by the file
// itself ("skip": "cpp"); every word of a case's "message_has" is in the
// error's what(). Also: the constants are the vector's.
// Built by scripts/test-cpp.sh (c++17 and c++20, strict, ASan/UBSan).
// Usage: bad_input PATH/TO/bad_input.json
#include <dlock.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "../c/json.h"
#include "../c/constants.h"

static int played, skipped, failed;

// The code word one case gets, or std::nullopt when this face has no way
// to play it; "ok" if nothing was refused.
static std::optional<std::string> play(const struct json *c) {
  const std::string input = json_str(c, "input");
  const char *setting_c = json_str(c, "setting");
  const std::string setting = setting_c ? setting_c : "";
  try {
    if (input == "setting" || input == "acquire_timeout") {
      const struct json *secs = json_get(c, "seconds");
      if (!secs || secs->kind != JSON_NUMBER) return std::nullopt;
      auto ms = std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(secs->number * 1000.0)));
      if (input == "acquire_timeout") {
        dlock::client client = dlock::client::memory();
        dlock::lock lock = client.lock("bad-input-timeout");
        lock.acquire(ms);
        return "ok";
      }
      dlock::options o;
      if (setting == "ttl") o.ttl = ms;
      else if (setting == "keepalive_interval") o.keepalive_interval = ms;
      else if (setting == "keepalive_timeout") o.keepalive_timeout = ms;
      else if (setting == "retry_interval") o.retry_interval = ms;
      else if (setting == "margin") o.margin = ms;
      else return std::nullopt;
      dlock::client client(o);
      return "ok";
    }
    if (input == "without_endpoints") {
      dlock::options o;
      const std::string value = json_str(c, "value");
      if (setting == "ca_file") o.ca_file = value;
      else if (setting == "cert_file") o.cert_file = value;
      else if (setting == "key_file") o.key_file = value;
      else if (setting == "user") o.user = value;
      else if (setting == "password") o.password = value;
      else return std::nullopt;
      dlock::client client(o);
      return "ok";
    }
    if (input == "description") {
      const struct json *value = json_get(c, "value");
      const struct json *len = json_get(c, "value_len");
      dlock::options o;
      if (value && value->kind == JSON_STRING) o.description.assign(value->text, value->len);
      else if (len && len->kind == JSON_NUMBER) o.description.assign(static_cast<std::size_t>(len->number), 'x');
      else return std::nullopt;
      if (o.description.find('\0') != std::string::npos) return std::nullopt;
      dlock::client client(o);
      return "ok";
    }
    if (input == "lock_name") {
      const struct json *name = json_get(c, "name");
      const struct json *len = json_get(c, "name_len");
      std::string n;
      if (name && name->kind == JSON_STRING) n.assign(name->text, name->len);  // NULs kept
      else if (len && len->kind == JSON_NUMBER) n.assign(static_cast<std::size_t>(len->number), 'a');
      else return std::nullopt;
      dlock::client client = dlock::client::memory();
      dlock::lock lock = client.lock(n);
      return "ok";
    }
    if (input == "semaphore_limit") {
      const std::string name = json_str(c, "name");
      dlock::client client = dlock::client::memory();
      if (const struct json *first = json_get(c, "first_limit")) {
        dlock::semaphore recorded = client.semaphore(name, static_cast<std::uint32_t>(first->number));
      }
      dlock::semaphore sem = client.semaphore(name, static_cast<std::uint32_t>(json_get(c, "limit")->number));
      return "ok";
    }
  } catch (const dlock::error &e) {
    std::printf("  %s\n", e.what());
    const struct json *words = json_get(c, "message_has");
    for (std::size_t w = 0; words && w < words->len; w++)
      if (!std::strstr(e.what(), words->items[w].text))
        return std::string("a message without \"") + words->items[w].text + "\"";
    return std::string(lk_status_name(e.code().value()));
  }
  return std::nullopt;
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "scenarios/vectors/bad_input.json";
  struct json v;
  if (json_load(path, &v) != 0) {
    std::printf("cpp bad_input: cannot read %s\n", path);
    return 1;
  }
  const struct json *cases = json_get(&v, "cases");
  if (!cases || cases->kind != JSON_ARRAY || cases->len == 0) {
    std::printf("FAIL no cases in %s\n", path);
    ++failed;
  }
  for (std::size_t i = 0; cases && i < cases->len; i++) {
    const struct json *c = &cases->items[i];
    const char *id = json_str(c, "id");
    const std::string want = json_str(c, "code");
    if (const char *why = json_str(json_get(c, "skip"), "cpp")) {
      std::printf("skip %s: %s\n", id, why);
      ++skipped;
      continue;
    }
    std::optional<std::string> got = play(c);
    if (!got) {
      std::printf("FAIL %s: C++ cannot play this case, yet the vector does not skip it\n", id);
      ++failed;
      continue;
    }
    ++played;
    if (*got != want) {
      std::printf("FAIL %s: got %s, expected %s\n", id, got->c_str(), want.c_str());
      ++failed;
    } else {
      std::printf("ok %s: %s\n", id, want.c_str());
    }
  }
  const struct json *k = json_get(&v, "constants");
  failed += constants_differ(k);
  json_free(&v);
  lk_shutdown();
  std::printf("cpp bad_input: %d played, %d skipped, %d failed\n", played, skipped, failed);
  return failed == 0 ? 0 : 1;
}
