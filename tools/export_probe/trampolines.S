# The probe's per-slot trampolines: slot i of table t is stub t*128+i.  A stub puts its number in
# r11 and joins common, which saves every argument register, asks xprobe_enter where the real slot
# is (it may point the caller's return at the landing pad), restores them and jumps there: the
# slot sees its arguments and its stack exactly as the caller left them.
	.text
	.altmacro
	.macro stub n
	.globl xprobe_stub_\n
xprobe_stub_\n:
	movl $\n, %r11d
	jmp common
	.endm
	.set i, 0
	.rept 1024
	stub %i
	.set i, i+1
	.endr

common:
	push %rdi
	push %rsi
	push %rdx
	push %rcx
	push %r8
	push %r9
	push %rax
	sub $128, %rsp
	movdqu %xmm0, 0(%rsp)
	movdqu %xmm1, 16(%rsp)
	movdqu %xmm2, 32(%rsp)
	movdqu %xmm3, 48(%rsp)
	movdqu %xmm4, 64(%rsp)
	movdqu %xmm5, 80(%rsp)
	movdqu %xmm6, 96(%rsp)
	movdqu %xmm7, 112(%rsp)
	mov %r11, %rdi
	lea 128(%rsp), %rsi
	lea 184(%rsp), %rdx
	call xprobe_enter
	mov %rax, %r11
	movdqu 0(%rsp), %xmm0
	movdqu 16(%rsp), %xmm1
	movdqu 32(%rsp), %xmm2
	movdqu 48(%rsp), %xmm3
	movdqu 64(%rsp), %xmm4
	movdqu 80(%rsp), %xmm5
	movdqu 96(%rsp), %xmm6
	movdqu 112(%rsp), %xmm7
	add $128, %rsp
	pop %rax
	pop %r9
	pop %r8
	pop %rcx
	pop %rdx
	pop %rsi
	pop %rdi
	jmp *%r11

	.globl xprobe_landing
xprobe_landing:
	push %rax
	push %rdx
	sub $32, %rsp
	movdqu %xmm0, 0(%rsp)
	movdqu %xmm1, 16(%rsp)
	mov %rax, %rdi
	call xprobe_leave
	mov %rax, %r11
	movdqu 0(%rsp), %xmm0
	movdqu 16(%rsp), %xmm1
	add $32, %rsp
	pop %rdx
	pop %rax
	jmp *%r11

	.section .data.rel.ro, "aw"
	.globl xprobe_stubs
	.balign 8
xprobe_stubs:
	.macro addr n
	.quad xprobe_stub_\n
	.endm
	.set i, 0
	.rept 1024
	addr %i
	.set i, i+1
	.endr
	.section .note.GNU-stack, "", @progbits
