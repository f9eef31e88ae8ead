/* A small JSON reader for the test vectors (the files of scenarios/vectors):
 * objects, arrays, strings (with \uXXXX escapes, NUL included), numbers,
 * true, false, null. Enough for test data; C11 and C++17 alike (the C and
 * C++ players of bad_input.json share it). Values live until json_free. */
#ifndef DLOCK_TEST_JSON_H
#define DLOCK_TEST_JSON_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum json_kind { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json {
  enum json_kind kind;
  double number;   /* JSON_NUMBER; JSON_BOOL: 0 or 1 */
  char *text;      /* JSON_STRING: the bytes (may hold NULs), NUL-terminated */
  size_t len;      /* JSON_STRING: bytes; JSON_ARRAY/OBJECT: items */
  char **keys;     /* JSON_OBJECT: the keys, in order */
  struct json *items;
};

struct json_in {
  const char *p, *end;
  int bad;
};

static inline void json_ws(struct json_in *in) {
  while (in->p < in->end && (*in->p == ' ' || *in->p == '\n' || *in->p == '\r' || *in->p == '\t')) in->p++;
}

static inline int json_hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* A string after its opening quote: bytes into a new buffer. */
static inline char *json_string(struct json_in *in, size_t *len_out) {
  char *out = (char *)malloc((size_t)(in->end - in->p) + 1);
  size_t n = 0;
  while (in->p < in->end && *in->p != '"') {
    char c = *in->p++;
    if (c != '\\') {
      out[n++] = c;
      continue;
    }
    if (in->p >= in->end) break;
    c = *in->p++;
    switch (c) {
      case 'n': out[n++] = '\n'; break;
      case 't': out[n++] = '\t'; break;
      case 'r': out[n++] = '\r'; break;
      case 'b': out[n++] = '\b'; break;
      case 'f': out[n++] = '\f'; break;
      case 'u': {
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
          int h = in->p < in->end ? json_hex(*in->p++) : -1;
          if (h < 0) in->bad = 1;
          v = v * 16 + (unsigned)(h < 0 ? 0 : h);
        }
        /* UTF-8; the vectors hold no surrogate pairs. */
        if (v < 0x80) {
          out[n++] = (char)v;
        } else if (v < 0x800) {
          out[n++] = (char)(0xC0 | (v >> 6));
          out[n++] = (char)(0x80 | (v & 0x3F));
        } else {
          out[n++] = (char)(0xE0 | (v >> 12));
          out[n++] = (char)(0x80 | ((v >> 6) & 0x3F));
          out[n++] = (char)(0x80 | (v & 0x3F));
        }
        break;
      }
      default: out[n++] = c; /* \" \\ \/ */
    }
  }
  if (in->p >= in->end) in->bad = 1;
  in->p++; /* the closing quote */
  out[n] = 0;
  *len_out = n;
  return out;
}

static inline void json_value(struct json_in *in, struct json *v);

static inline void json_push(struct json *v, char *key, struct json_in *in) {
  v->items = (struct json *)realloc(v->items, (v->len + 1) * sizeof *v->items);
  if (v->kind == JSON_OBJECT) {
    v->keys = (char **)realloc(v->keys, (v->len + 1) * sizeof *v->keys);
    v->keys[v->len] = key;
  }
  json_value(in, &v->items[v->len]);
  v->len++;
}

static inline void json_value(struct json_in *in, struct json *v) {
  memset(v, 0, sizeof *v);
  json_ws(in);
  if (in->p >= in->end) {
    in->bad = 1;
    return;
  }
  char c = *in->p;
  if (c == '{' || c == '[') {
    v->kind = c == '{' ? JSON_OBJECT : JSON_ARRAY;
    char close = c == '{' ? '}' : ']';
    in->p++;
    json_ws(in);
    if (in->p < in->end && *in->p == close) {
      in->p++;
      return;
    }
    while (!in->bad) {
      char *key = NULL;
      json_ws(in);
      if (v->kind == JSON_OBJECT) {
        size_t klen;
        if (in->p >= in->end || *in->p != '"') {
          in->bad = 1;
          return;
        }
        in->p++;
        key = json_string(in, &klen);
        json_ws(in);
        if (in->p >= in->end || *in->p != ':') {
          free(key);
          in->bad = 1;
          return;
        }
        in->p++;
      }
      json_push(v, key, in);
      json_ws(in);
      if (in->p < in->end && *in->p == ',') {
        in->p++;
        continue;
      }
      if (in->p < in->end && *in->p == close) {
        in->p++;
        return;
      }
      in->bad = 1;
    }
    return;
  }
  if (c == '"') {
    in->p++;
    v->kind = JSON_STRING;
    v->text = json_string(in, &v->len);
    return;
  }
  if (!strncmp(in->p, "true", 4) || !strncmp(in->p, "false", 5)) {
    v->kind = JSON_BOOL;
    v->number = c == 't';
    in->p += c == 't' ? 4 : 5;
    return;
  }
  if (!strncmp(in->p, "null", 4)) {
    in->p += 4;
    return;
  }
  char *after;
  v->kind = JSON_NUMBER;
  v->number = strtod(in->p, &after);
  if (after == in->p) in->bad = 1;
  in->p = after;
}

static inline void json_free(struct json *v) {
  for (size_t i = 0; i < v->len && (v->kind == JSON_ARRAY || v->kind == JSON_OBJECT); i++) {
    json_free(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->text);
}

/* The file at `path` parsed into `v`; 0 on success. */
static inline int json_load(const char *path, struct json *v) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = (char *)malloc((size_t)size + 1);
  size_t got = fread(buf, 1, (size_t)size, f);
  fclose(f);
  buf[got] = 0;
  struct json_in in = {buf, buf + got, 0};
  json_value(&in, v);
  free(buf);
  return in.bad ? -1 : 0;
}

/* The member `key` of an object, or NULL. */
static inline const struct json *json_get(const struct json *o, const char *key) {
  if (!o || o->kind != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < o->len; i++)
    if (!strcmp(o->keys[i], key)) return &o->items[i];
  return NULL;
}

/* The string member `key`, or NULL. */
static inline const char *json_str(const struct json *o, const char *key) {
  const struct json *v = json_get(o, key);
  return v && v->kind == JSON_STRING ? v->text : NULL;
}

#endif
