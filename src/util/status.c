#include "sluice/status.h"

const char *sl_status_str(sl_status st) {
  switch (st) {
#define SL__STATUS_STR(name, code, str)                                        \
  case SL_##name:                                                              \
    return str;
    SL_STATUS_MAP(SL__STATUS_STR)
#undef SL__STATUS_STR
  }
  return "unknown status";
}

const char *sl_status_name(sl_status st) {
  switch (st) {
#define SL__STATUS_NAME(name, code, str)                                       \
  case SL_##name:                                                              \
    return #name;
    SL_STATUS_MAP(SL__STATUS_NAME)
#undef SL__STATUS_NAME
  }
  return "UNKNOWN";
}
