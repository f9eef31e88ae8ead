/* The C player of scenarios/vectors/bad_input.json: every case the C face
 * can express gets the vector's code (lk_status_name), decided by the core;
 * the cases C cannot express are skipped by the file itself ("skip": "c").
 * Every word of a case's "message_has" is in lk_last_error().
 * Also: the constants the header exports are the vector's (the core's).
 * Usage: bad_input PATH/TO/bad_input.json */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "check.h"
#include "json.h"
#include "constants.h"

static int played, skipped;

/* The status of one case, or -1 if C has no way to play it. */
static int play(const struct json *c) {
  const char *input = json_str(c, "input");
  const char *setting = json_str(c, "setting");
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  struct lk_client *client = NULL;
  enum lk_status s;
  if (!strcmp(input, "setting")) {
    const struct json *secs = json_get(c, "seconds");
    if (!secs || secs->kind != JSON_NUMBER || secs->number < 0) return -1;
    uint64_t ms = (uint64_t)(secs->number * 1000.0 + 0.5);
    if (!strcmp(setting, "ttl")) o.ttl_ms = ms;
    else if (!strcmp(setting, "keepalive_interval")) o.keepalive_interval_ms = ms;
    else if (!strcmp(setting, "keepalive_timeout")) o.keepalive_timeout_ms = ms;
    else if (!strcmp(setting, "retry_interval")) o.retry_interval_ms = ms;
    else if (!strcmp(setting, "margin")) o.margin_ms = ms;
    else return -1;
  } else if (!strcmp(input, "without_endpoints")) {
    const char *value = json_str(c, "value");
    if (!strcmp(setting, "ca_file")) o.ca_file = value;
    else if (!strcmp(setting, "cert_file")) o.cert_file = value;
    else if (!strcmp(setting, "key_file")) o.key_file = value;
    else if (!strcmp(setting, "user")) o.user = value;
    else if (!strcmp(setting, "password")) o.password = value;
    else return -1;
  } else if (!strcmp(input, "description")) {
    const struct json *value = json_get(c, "value");
    const struct json *len = json_get(c, "value_len");
    char *d;
    if (value && value->kind == JSON_STRING) {
      if (strlen(value->text) != value->len) return -1; /* a NUL inside */
      d = (char *)malloc(value->len + 1);
      memcpy(d, value->text, value->len + 1);
    } else if (len && len->kind == JSON_NUMBER) {
      size_t k = (size_t)len->number;
      d = (char *)malloc(k + 1);
      memset(d, 'x', k);
      d[k] = 0;
    } else {
      return -1;
    }
    o.description = d;
    s = lk_client_new(&o, &client);
    lk_client_free(client);
    free(d);
    return (int)s;
  } else if (!strcmp(input, "lock_name")) {
    const struct json *name = json_get(c, "name");
    const struct json *len = json_get(c, "name_len");
    char *n;
    if (name && name->kind == JSON_STRING) {
      if (strlen(name->text) != name->len) return -1; /* a NUL inside */
      n = (char *)malloc(name->len + 1);
      memcpy(n, name->text, name->len + 1);
    } else if (len && len->kind == JSON_NUMBER) {
      size_t k = (size_t)len->number;
      n = (char *)malloc(k + 1);
      memset(n, 'a', k);
      n[k] = 0;
    } else {
      return -1;
    }
    struct lk_lock *lock = NULL;
    s = lk_client_new(NULL, &client);
    if (s == LK_OK) {
      s = lk_lock_new(client, n, &lock);
      lk_lock_free(lock);
      lk_client_free(client);
    }
    free(n);
    return (int)s;
  } else if (!strcmp(input, "semaphore_limit")) {
    const char *name = json_str(c, "name");
    const struct json *first = json_get(c, "first_limit");
    struct lk_semaphore *sem = NULL;
    s = lk_client_new(NULL, &client);
    if (s == LK_OK && first) {
      s = lk_semaphore_new(client, name, (uint32_t)first->number, &sem);
      CHECK(s == LK_OK); /* the first handle records its limit */
      lk_semaphore_free(sem);
      sem = NULL;
    }
    if (s == LK_OK) s = lk_semaphore_new(client, name, (uint32_t)json_get(c, "limit")->number, &sem);
    lk_semaphore_free(sem);
    lk_client_free(client);
    return (int)s;
  } else {
    return -1;
  }
  s = lk_client_new(&o, &client);
  lk_client_free(client);
  return (int)s;
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "scenarios/vectors/bad_input.json";
  struct json v;
  if (json_load(path, &v) != 0) {
    fprintf(stderr, "bad_input: cannot read %s\n", path);
    return 1;
  }
  const struct json *cases = json_get(&v, "cases");
  CHECK(cases && cases->kind == JSON_ARRAY && cases->len > 0);
  for (size_t i = 0; cases && i < cases->len; i++) {
    const struct json *c = &cases->items[i];
    const char *id = json_str(c, "id");
    const char *want = json_str(c, "code");
    const char *why = json_str(json_get(c, "skip"), "c");
    if (why) {
      printf("skip %s: %s\n", id, why);
      skipped++;
      continue;
    }
    int got = play(c);
    if (got < 0) {
      fprintf(stderr, "%s: C cannot play this case, yet the vector does not skip it\n", id);
      failures++;
      continue;
    }
    played++;
    const struct json *words = json_get(c, "message_has");
    const char *missing = NULL;
    for (size_t w = 0; words && w < words->len; w++)
      if (!strstr(lk_last_error(), words->items[w].text)) missing = words->items[w].text;
    if (strcmp(lk_status_name(got), want) != 0) {
      fprintf(stderr, "%s: got %s (%s), expected %s\n", id, lk_status_name(got), lk_last_error(), want);
      failures++;
    } else if (missing) {
      fprintf(stderr, "%s: \"%s\" not in \"%s\"\n", id, missing, lk_last_error());
      failures++;
    } else {
      printf("ok %s: %s (%s)\n", id, want, lk_last_error());
    }
  }
  const struct json *k = json_get(&v, "constants");
  failures += constants_differ(k);
  json_free(&v);
  printf("bad_input: %d played, %d skipped\n", played, skipped);
  lk_shutdown();
  return finish("bad_input");
}
