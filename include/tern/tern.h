/* tern: the one header an application includes (#include <tern/tern.h>). */
#ifndef TERN_H
#define TERN_H

#include "error.h"
#include "transport.h"
#include "rpc.h"

#endif
