/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the generated entries (native/cuda_api/generated/guest_entries.c) need:
 * the call helpers, the connection, contexts and function handles.  Each
 * hand-written file includes only the headers of its own concerns.
 */
#ifndef VG_GUEST_H
#define VG_GUEST_H

#include "call.h"
#include "connection.h"
#include "context.h"
#include "function.h"

#endif
