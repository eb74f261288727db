#include "suites.h"
Suite *suite_rpc_procs(void) { return suite_create("rpc_procs"); }
