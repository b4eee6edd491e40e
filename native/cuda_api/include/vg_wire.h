/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA remoting protocol carried over a vmgpu shared-memory channel.
 *
 * One request record (transport type VG_REC_REQUEST) per call:
 *     struct vg_req_hdr, then the arguments, each padded to 8 bytes:
 *       value          sizeof(T) bytes
 *       in (pointer)   u64 present, then sizeof(*p) bytes if present
 *       out (pointer)  u64 present (the host writes it back on success)
 *       string         u64 length including the NUL, then the bytes
 *       array          u64 count, then count * sizeof(T) bytes
 * Sync calls get one reply record (VG_REC_REPLY): struct vg_rep_hdr, then the
 * out values in parameter order, each padded to 8.  Async calls get none.
 *
 * Opcodes 1..15 are the protocol's own ([protocol] in api.toml, generated into vg_proto_ops.h);
 * 16.. are the CUDA calls ([fn], generated/vg_ops.h).  Both are stable: append only.
 */
#ifndef VG_WIRE_H
#define VG_WIRE_H

#include <stdint.h>

/* 2: module and library loads carry their JIT options and answer with the logs (ops 67, 69) */
#define VG_PROTO_VERSION 2

enum vg_rec_type {
	VG_REC_REQUEST = 1,
	VG_REC_REPLY = 2,
};

struct vg_req_hdr {
	uint32_t op;
	uint16_t dev;   /* the guest's current device ordinal, VG_NO_DEVICE if none */
	uint16_t flags; /* VG_F_* */
	uint64_t seq;   /* per channel, increasing; echoed in the reply */
};

struct vg_rep_hdr {
	int32_t result; /* CUresult */
	uint32_t op;
	uint64_t seq;
};

#define VG_NO_DEVICE 0xFFFFu
#define VG_F_PTDS 0x1u    /* the guest called the _ptds/_ptsz variant */
#define VG_F_NOREPLY 0x2u /* async: no reply; an error is latched for the next reporting call */

/* The protocol's own opcodes (VG_OP_HELLO ...), generated from [protocol] in api.toml. */
#include "vg_proto_ops.h"

/* Where a host buffer a request names lives (guest copy.c; host host_memory.c, copy.c): in the
 * request or the reply itself, at an offset in the region's heap, or at a position in the
 * channel's bulk area.  A unified address (cuMemcpy, pointer attributes) is INLINE for a device
 * address (or any address the guest has), HEAP for a heap offset. */
enum vg_buf_kind { VG_BUF_INLINE = 0, VG_BUF_HEAP = 1, VG_BUF_BULK = 2 };

/* An address or value the host answers in the guest's terms, never in its own: */
enum vg_answer_kind {
	VG_ANSWER_VALUE = 0,  /* the value itself (a device address of the guest's own, a number) */
	VG_ANSWER_DEVICE = 1, /* a device index, UINT64_MAX for none: the guest's context of it */
	VG_ANSWER_REGION = 2, /* a region offset: the guest's own pointer into the region */
};
/* cuPointerGetAttribute(s): one per attribute, its value's bytes (at most 16) in value[]. */
struct vg_attr_answer {
	uint64_t kind; /* enum vg_answer_kind */
	uint64_t value[2];
};
/* cuMemHostGetDevicePointer: the device address (VALUE) or the memory's region offset (REGION). */
struct vg_addr_answer {
	uint64_t kind; /* enum vg_answer_kind */
	uint64_t value;
};

#define VG_MAX_DEVICES 16
/* cuPointerGetAttributes: at most this many attributes in one query (the driver has 21) */
#define VG_MAX_POINTER_ATTRS 32
#define VG_MAX_ATTRS 160 /* >= CU_DEVICE_ATTRIBUTE_MAX of CUDA 13 */
#define VG_MAX_PARAMS 1024
#define VG_MAX_LAUNCH_ATTRS 16 /* attributes of one launch configuration (cuLaunchKernelEx) */
#define VG_MAX_BLOB (1ull << 30)

struct vg_hello_req {
	uint32_t proto_version;
	uint32_t pid;
};

struct vg_hello_rep {
	uint32_t proto_version;
	int32_t driver_version;
	uint32_t ndev;
	uint32_t flags;            /* VG_HELLO_* */
	uint64_t heap_registered;  /* 1 if the host registered the region's heap with the driver */
};

#define VG_HELLO_SIMULATED 0x1u /* the host runs the simulated backend, not a GPU */

struct vg_dev_info {
	char name[256];
	uint8_t uuid[16];
	uint64_t total_mem;   /* the guest's quota on this device */
	int32_t pci_domain, pci_bus, pci_device;
	int32_t nattrs;
	int32_t attrs[VG_MAX_ATTRS]; /* index = CUdevice_attribute */
};

/* VG_OP_NVML_QUERY: the guest's own slice of one GPU, for its NVML (guest_agent/nvml/): memory
 * from the forwarder's charges, processes from its channel table (this guest's processes only); the
 * rest is read from the host's NVML where it can be, each value valid only if its VG_NVML_* bit is
 * set. */
#define VG_NVML_MAX_PROCS 64
#define VG_NVML_MAX_LINKS 18 /* NVML_NVLINK_MAX_LINKS */
#define VG_NVML_P2P_CAPS 6   /* nvmlGpuP2PCapsIndex_t: read, write, NvLink, atomics, PCI, unknown */
/* What is at the far end of an NvLink, as the guest may know it. */
enum vg_nvml_remote {
	VG_NVML_REMOTE_HIDDEN = 0,    /* not the guest's to know: a GPU outside the guest, a CPU, unknown */
	VG_NVML_REMOTE_GUEST_GPU = 1, /* one of the guest's own GPUs (remote_dev) */
	VG_NVML_REMOTE_SWITCH = 2,    /* an NVSwitch */
};
struct vg_nvml_proc {
	uint32_t pid; /* as the guest process gave it (its own pid namespace) */
	uint32_t pad;
	uint64_t bytes;
};
struct vg_nvml_live {
	uint64_t quota, used;         /* bytes: the guest's quota on the GPU, what its processes hold */
	uint32_t nprocs, flags;       /* processes holding memory on it (at most VG_NVML_MAX_PROCS); VG_NVML_* */
	uint32_t util_gpu, util_mem;  /* % of the GPU's time this guest's kernels (copies) ran, last second */
	uint32_t temp_c, fan_pct, pstate, compute_mode;
	uint32_t power_mw, power_limit_mw;
	uint32_t clock_mhz[4], max_clock_mhz[4]; /* by nvmlClockType_t: graphics, SM, memory, video */
	uint32_t ecc_current, ecc_pending, persistence, pad;
	uint32_t pci_device_id, pci_subsystem_id; /* nvmlPciInfo_t's: device << 16 | vendor, subsystem */
	char driver_version[32];      /* the host driver's version ("580.159.04") */
	struct vg_nvml_proc procs[VG_NVML_MAX_PROCS];
	/* How the GPU reaches the guest's other GPUs (valid iff has_topology, from the host's NVML
	 * or the simulated backend's): each NvLink, and the P2P status to each of the guest's GPUs
	 * (itself included) by nvmlGpuP2PCapsIndex_t.  A link's far end is named only as one of
	 * this guest's GPUs or as a switch, never by the host's address; `ret`s are the host NVML's
	 * nvmlReturn_t (0: the value is valid). */
	uint32_t has_topology, pad2;
	struct vg_nvml_link {
		uint16_t state_ret, version_ret, remote_ret;
		uint8_t state, version;       /* nvmlEnableState_t; nvmlDeviceGetNvLinkVersion's */
		uint8_t caps, caps_known;     /* bit c: nvmlNvLinkCapability_t c is set; the host answered it */
		uint8_t remote, remote_dev;   /* VG_NVML_REMOTE_*; the guest's device index for ..._GUEST_GPU */
	} links[VG_NVML_MAX_LINKS];
	struct vg_nvml_p2p {
		uint16_t ret;
		uint16_t status;              /* nvmlGpuP2PStatus_t */
	} p2p[VG_MAX_DEVICES][VG_NVML_P2P_CAPS];
};
#define VG_NVML_UTIL 0x1u
#define VG_NVML_TEMP 0x2u
#define VG_NVML_FAN 0x4u
#define VG_NVML_PSTATE 0x8u
#define VG_NVML_POWER 0x10u
#define VG_NVML_POWER_LIMIT 0x20u
#define VG_NVML_CLOCKS 0x40u
#define VG_NVML_MAX_CLOCKS 0x80u
#define VG_NVML_ECC 0x100u
#define VG_NVML_COMPUTE_MODE 0x200u
#define VG_NVML_PERSISTENCE 0x400u
#define VG_NVML_PCI_IDS 0x800u
#define VG_NVML_DRIVER 0x1000u

struct vg_param_info {
	uint32_t offset, size;
};

#endif /* VG_WIRE_H */
