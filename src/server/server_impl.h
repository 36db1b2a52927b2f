/* sluice — server internals, all at once: for the tests and fuzz harnesses
 * that reach into several server files. No file of src/server includes
 * it: each includes the headers of the files whose functions it uses
 * (state.h lists them, bottom first). The libmicrohttpd side (state.h,
 * reply.h, generate.h, detach.h) is left out; so are proxy.h and
 * origin.h, which their tests include themselves. */
#ifndef SLUICE_SERVER_IMPL_H
#define SLUICE_SERVER_IMPL_H

#include "server/admin.h"
#include "server/answer.h"
#include "server/anthropic.h"
#include "server/constrain.h"
#include "server/door.h"
#include "server/embed.h"
#include "server/head.h"
#include "server/job.h"
#include "server/json.h"
#include "server/json_scan.h"
#include "server/openai.h"
#include "server/parse.h"
#include "server/prompt.h"
#include "server/reasoning.h"
#include "server/reasoning_req.h"
#include "server/routes.h"
#include "server/schema.h"
#include "server/sockwatch.h"
#include "server/toolcall.h"
#include "server/tools.h"

#endif
