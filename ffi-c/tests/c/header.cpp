// The header from C++: the INIT macros, the enums and one call link and run.
#include "dlock.h"

#include <cstdio>
#include <cstring>

int main() {
  lk_client_options opts = LK_CLIENT_OPTIONS_INIT;
  struct lk_permit permit = LK_PERMIT_INIT;  // `struct`: lk_permit() is the function
  lk_client_options fn;
  if (lk_client_options_init(&fn, LK_CLIENT_OPTIONS_VERSION) != LK_OK) return 1;
  if (fn.ttl_ms != opts.ttl_ms || std::strcmp(lk_status_name(LK_FENCED), "fenced") != 0) return 1;
  lk_permit_end(&permit);
  enum lk_state st = LK_STATE_HOLDING;
  std::printf("header.cpp: ok (%s)\n", lk_state_name(st));
  return 0;
}
