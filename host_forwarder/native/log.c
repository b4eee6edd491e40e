/* SPDX-License-Identifier: Apache-2.0 */
/* The forwarder's log: every line names the guest, and says so when the backend is simulated. */
#include <stdarg.h>
#include <stdio.h>

#include "process.h"

static void log_line(const char *prefix, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	/* the simulated backend says so on every line */
	fprintf(stderr, "vmgpu-forwarder[%s]%s %s%s\n", F.guest, BK.simulated ? " SIMULATED (no GPU):" : "", prefix, msg);
}

void vh_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_line("", fmt, ap);
	va_end(ap);
}

int vh_die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_line("error: ", fmt, ap);
	va_end(ap);
	return 1;
}

const char *vh_error_name(CUresult r)
{
	const char *s = NULL;
	if (BK.cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
		return "unknown CUDA error";
	return s;
}
