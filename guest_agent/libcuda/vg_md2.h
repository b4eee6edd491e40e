/* SPDX-License-Identifier: Apache-2.0 */
#ifndef VG_MD2_H
#define VG_MD2_H

#include <stddef.h>
#include <stdint.h>

struct vg_md2 {
	uint8_t x[48], c[16], buf[16];
	unsigned n;
};
void vg_md2_init(struct vg_md2 *m);
/* Feed len bytes, each XORed with xor_mask (the HMAC pads). */
void vg_md2_update(struct vg_md2 *m, const void *data, size_t len, uint8_t xor_mask);
void vg_md2_final(struct vg_md2 *m, uint8_t out[16]);

#endif
