/* MD2 against RFC 1319's test vectors (the export-table integrity check is built on it). */
#include <stdio.h>
#include <string.h>

#include "vg_md2.h"

int main(void)
{
	static const char *in[] = {"", "a", "abc", "message digest", "abcdefghijklmnopqrstuvwxyz",
				   "12345678901234567890123456789012345678901234567890123456789012345678901234567890"};
	static const char *want[] = {"8350e5a3e24c153df2275c9f80692773", "32ec01ec4a6dac72c0ab96fb34c0b5d1",
				     "da853b0d3f88d99b30283a69e6ded6bb", "ab4f496bfb2a530b219ff33031fe06b0",
				     "4e8ddff3650292ab5a4108c3aa47940b", "d5976f79d83d3a0dc9806c3c66f3efd8"};
	int bad = 0;
	for (unsigned i = 0; i < sizeof in / sizeof in[0]; i++) {
		struct vg_md2 m;
		unsigned char out[16];
		char hex[33];
		vg_md2_init(&m);
		vg_md2_update(&m, in[i], strlen(in[i]), 0);
		vg_md2_final(&m, out);
		for (int k = 0; k < 16; k++)
			snprintf(hex + 2 * k, 3, "%02x", out[k]);
		if (strcmp(hex, want[i])) {
			printf("MD2(\"%s\") = %s, want %s\n", in[i], hex, want[i]);
			bad = 1;
		}
	}
	printf(bad ? "t_md2: FAILED\n" : "t_md2: ok\n");
	return bad;
}
