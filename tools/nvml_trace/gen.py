"""Write stubs.S and names.h for an NVML tracing library from a list of exported function names.

Usage: python3 gen.py EXPORTS.txt   (one name per line: nm -D --defined-only libnvidia-ml.so.1)
"""

import sys

# nvmlInternalGetExportTable is written in C (nvtrace.c): it wraps the tables it hands out
names = [n.strip() for n in open(sys.argv[1]) if n.strip() and n.strip() != "nvmlInternalGetExportTable"]
# each export calls the real function with the caller's own stack (its return address swapped
# for ours, so stack arguments pass through), then logs the result (NVT_VERBOSE=1)
with open("stubs.S", "w") as f:
    f.write(".text\n")
    for i, n in enumerate(names):
        f.write(
            f".globl {n}\n.type {n},@function\n{n}:\n"
            f"  lock incq nvt_counts+{8 * i}(%rip)\n"
            f"  cmpq $0, nvt_real+{8 * i}(%rip)\n"
            f"  jne 2f\n"
            f"  movl ${i}, %edi\n"
            f"  jmp nvt_fake\n"
            f"2: popq %r11\n  movq %r11, nvt_ret(%rip)\n"
            f"  call *nvt_real+{8 * i}(%rip)\n"
            f"  pushq nvt_ret(%rip)\n  pushq %rax\n"
            f"  movl ${i}, %edi\n  movq %rax, %rsi\n  call nvt_returned\n  popq %rax\n  ret\n"
        )
    f.write('.section .note.GNU-stack,"",@progbits\n')
with open("names.h", "w") as f:
    f.write(f"#define NVT_N {len(names)}\nstatic const char *nvt_names[NVT_N] = {{\n")
    for n in names:
        f.write(f'\t"{n}",\n')
    f.write("};\n")
# export-table slot trampolines: the real slot is called with the caller's own stack (its return
# address swapped for ours), so functions with stack arguments pass through unchanged
TABLES, SLOTS = 8, 320
with open("slots.S", "w") as f:
    f.write(".text\n")
    for t in range(TABLES):
        for i in range(SLOTS):
            k = t * SLOTS + i
            f.write(
                f".globl nvt_slot_{k}\n.hidden nvt_slot_{k}\nnvt_slot_{k}:\n"
                "  movq %rdi, nvt_args(%rip)\n  movq %rsi, nvt_args+8(%rip)\n  movq %rdx, nvt_args+16(%rip)\n"
                "  movq %rcx, nvt_args+24(%rip)\n  movq %r8, nvt_args+32(%rip)\n  movq %r9, nvt_args+40(%rip)\n"
                f"  subq $8, %rsp\n  movl ${k}, %edi\n  call nvt_before\n  addq $8, %rsp\n"
                "  movq nvt_args(%rip), %rdi\n  movq nvt_args+8(%rip), %rsi\n  movq nvt_args+16(%rip), %rdx\n"
                "  movq nvt_args+24(%rip), %rcx\n  movq nvt_args+32(%rip), %r8\n  movq nvt_args+40(%rip), %r9\n"
                "  popq %r11\n  movq %r11, nvt_ret(%rip)\n"
                f"  call *nvt_table_real+{8 * k}(%rip)\n"
                "  pushq nvt_ret(%rip)\n  pushq %rax\n"
                f"  movl ${k}, %edi\n  movq %rax, %rsi\n  call nvt_after\n  popq %rax\n  ret\n"
            )
    f.write('.section .note.GNU-stack,"",@progbits\n.data\n.globl nvt_slot_fns\n.hidden nvt_slot_fns\nnvt_slot_fns:\n')
    for k in range(TABLES * SLOTS):
        f.write(f"  .quad nvt_slot_{k}\n")
