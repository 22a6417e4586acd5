#include "textflag.h"

// AES-256-XTS over whole 16-byte blocks with AES-NI, eight blocks at a
// time so that the AES unit's pipeline stays full (one block at a time,
// each round waits for the previous one's result). See xts_amd64.go.
//
// Registers: X0-X7 eight blocks, X8 the round key, X9 the running tweak,
// X10 scratch, X11 the doubling mask; AX round keys, SI src, DI dst,
// CX blocks left, DX the tweak's address. The eight tweaks of a batch
// are kept on the stack between the whitening before and after the
// rounds.

// Dwords {0x87, 0, 1, 0}: see DOUBLE.
DATA xtsMask<>+0(SB)/4, $0x87
DATA xtsMask<>+4(SB)/4, $0
DATA xtsMask<>+8(SB)/4, $1
DATA xtsMask<>+12(SB)/4, $0
GLOBL xtsMask<>(SB), RODATA|NOPTR, $16

// DOUBLE multiplies the tweak T by x modulo x^128 + x^7 + x^2 + x + 1.
// PADDQ shifts each 64-bit half left by one; the bits shifted out of the
// halves (bits 63 and 127, the sign bits of dwords 1 and 3) come back as
// masks: PSHUFD puts dword 3 at dword 0 and dword 1 at dword 2, PSRAL
// spreads their sign bits, and the mask keeps 0x87 (the reduction) and
// 1 (the carry into the high half) where they belong.
#define DOUBLE(T) \
	PSHUFD $0x13, T, X10; \
	PADDQ  T, T; \
	PSRAL  $31, X10; \
	PAND   X11, X10; \
	PXOR   X10, T

// WHITEN loads block i of the batch, XORs in the tweak, saves the tweak
// for the way out and moves to the next one.
#define WHITEN(i, X) \
	MOVOU (i*16)(SI), X; \
	PXOR  X9, X; \
	MOVOU X9, (i*16)(SP); \
	DOUBLE(X9)

// UNWHITEN XORs block i's tweak back in and stores the block.
#define UNWHITEN(i, X) \
	MOVOU (i*16)(SP), X10; \
	PXOR  X10, X; \
	MOVOU X, (i*16)(DI)

#define ROUND8(OP, r) \
	MOVOU (r*16)(AX), X8; \
	OP X8, X0; OP X8, X1; OP X8, X2; OP X8, X3; \
	OP X8, X4; OP X8, X5; OP X8, X6; OP X8, X7

#define ROUND1(OP, r) \
	MOVOU (r*16)(AX), X8; \
	OP X8, X0

// ROUNDS runs AES-256 with the round macro R: the whitening with round
// key 0 (XOR), thirteen rounds (OP) and the last (LAST).
#define ROUNDS(R, XOR, OP, LAST) \
	R(XOR, 0); \
	R(OP, 1); R(OP, 2); R(OP, 3); R(OP, 4); R(OP, 5); R(OP, 6); R(OP, 7); \
	R(OP, 8); R(OP, 9); R(OP, 10); R(OP, 11); R(OP, 12); R(OP, 13); \
	R(LAST, 14)

// ARGS loads the arguments: AX round keys, DI dst, SI src, CX the number
// of blocks, DX the tweak's address and X9 the tweak; and X11 the
// doubling mask.
#define ARGS \
	MOVQ  rk+0(FP), AX; \
	MOVQ  dst_base+8(FP), DI; \
	MOVQ  src_base+32(FP), SI; \
	MOVQ  src_len+40(FP), CX; \
	SHRQ  $4, CX; \
	MOVQ  tweak+56(FP), DX; \
	MOVOU (DX), X9; \
	MOVOU xtsMask<>(SB), X11

// XTS(OP, LAST) is the body of xtsEncryptAsm and xtsDecryptAsm: OP is
// AESENC or AESDEC, LAST the matching last-round instruction.
#define XTS(OP, LAST) \
	ARGS; \
	; \
loop8: \
	CMPQ  CX, $8; \
	JB    tail; \
	WHITEN(0, X0); WHITEN(1, X1); WHITEN(2, X2); WHITEN(3, X3); \
	WHITEN(4, X4); WHITEN(5, X5); WHITEN(6, X6); WHITEN(7, X7); \
	ROUNDS(ROUND8, PXOR, OP, LAST); \
	UNWHITEN(0, X0); UNWHITEN(1, X1); UNWHITEN(2, X2); UNWHITEN(3, X3); \
	UNWHITEN(4, X4); UNWHITEN(5, X5); UNWHITEN(6, X6); UNWHITEN(7, X7); \
	ADDQ  $128, SI; \
	ADDQ  $128, DI; \
	SUBQ  $8, CX; \
	JMP   loop8; \
	; \
tail: \
	TESTQ CX, CX; \
	JZ    done; \
	WHITEN(0, X0); \
	ROUNDS(ROUND1, PXOR, OP, LAST); \
	UNWHITEN(0, X0); \
	ADDQ  $16, SI; \
	ADDQ  $16, DI; \
	DECQ  CX; \
	JMP   tail; \
	; \
done: \
	MOVOU X9, (DX); \
	RET

// func xtsEncryptAsm(rk *roundKeys, dst, src []byte, tweak *[16]byte)
TEXT ·xtsEncryptAsm(SB), NOSPLIT, $128-64
	XTS(AESENC, AESENCLAST)

// func xtsDecryptAsm(rk *roundKeys, dst, src []byte, tweak *[16]byte)
TEXT ·xtsDecryptAsm(SB), NOSPLIT, $128-64
	XTS(AESDEC, AESDECLAST)

// The VAES kernel: the same transform with 256-bit registers, two blocks
// per register, sixteen blocks per batch; len(src) is a multiple of 256.
// The batch's sixteen tweaks live on the stack, block j's at 16j. Doubling
// one tweak after another would be a chain of sixteen dependent steps per
// batch, longer than the batch's AES rounds; instead each slot moves on
// to the next batch on its own, multiplied by x^16: shifted left two
// bytes within its lane, the two bytes shifted out folded back in by one
// carry-less multiplication by x^7 + x^2 + x + 1 (x^128 modulo the field
// polynomial). Registers: Y0-Y7 blocks, Y8 round key, Y11 that polynomial
// in each lane, Y12-Y13 scratch. (A remainder of fewer than sixteen blocks
// would be left as it is; the caller passes none.)

// Qwords {0x87, 0}: x^128 modulo x^128 + x^7 + x^2 + x + 1.
DATA xtsPoly<>+0(SB)/8, $0x87
DATA xtsPoly<>+8(SB)/8, $0
GLOBL xtsPoly<>(SB), RODATA|NOPTR, $16

#define VWHITEN(i, Y) \
	VMOVDQU (i*32)(SI), Y; \
	VPXOR   (i*32)(SP), Y, Y

#define VUNWHITEN(i, Y) \
	VPXOR   (i*32)(SP), Y, Y; \
	VMOVDQU Y, (i*32)(DI)

// ADVANCE multiplies the tweaks in slot i (two blocks) by x^16.
#define ADVANCE(i) \
	VMOVDQU    (i*32)(SP), Y12; \
	VPSRLDQ    $14, Y12, Y13; \
	VPSLLDQ    $2, Y12, Y12; \
	VPCLMULQDQ $0x00, Y11, Y13, Y13; \
	VPXOR      Y13, Y12, Y12; \
	VMOVDQU    Y12, (i*32)(SP)

#define VROUND8(OP, r) \
	VBROADCASTI128 (r*16)(AX), Y8; \
	OP Y8, Y0, Y0; OP Y8, Y1, Y1; OP Y8, Y2, Y2; OP Y8, Y3, Y3; \
	OP Y8, Y4, Y4; OP Y8, Y5, Y5; OP Y8, Y6, Y6; OP Y8, Y7, Y7

// FIRST stores the tweak in X9 as block i's and doubles it (X10, X11 as
// in DOUBLE).
#define FIRST(i) \
	MOVOU X9, (i*16)(SP); \
	DOUBLE(X9)

#define VXTS(OP, LAST) \
	ARGS; \
	FIRST(0); FIRST(1); FIRST(2); FIRST(3); FIRST(4); FIRST(5); FIRST(6); FIRST(7); \
	FIRST(8); FIRST(9); FIRST(10); FIRST(11); FIRST(12); FIRST(13); FIRST(14); FIRST(15); \
	VBROADCASTI128 xtsPoly<>(SB), Y11; \
	; \
loop16: \
	CMPQ  CX, $16; \
	JB    done; \
	VWHITEN(0, Y0); VWHITEN(1, Y1); VWHITEN(2, Y2); VWHITEN(3, Y3); \
	VWHITEN(4, Y4); VWHITEN(5, Y5); VWHITEN(6, Y6); VWHITEN(7, Y7); \
	ROUNDS(VROUND8, VPXOR, OP, LAST); \
	VUNWHITEN(0, Y0); VUNWHITEN(1, Y1); VUNWHITEN(2, Y2); VUNWHITEN(3, Y3); \
	VUNWHITEN(4, Y4); VUNWHITEN(5, Y5); VUNWHITEN(6, Y6); VUNWHITEN(7, Y7); \
	ADVANCE(0); ADVANCE(1); ADVANCE(2); ADVANCE(3); \
	ADVANCE(4); ADVANCE(5); ADVANCE(6); ADVANCE(7); \
	ADDQ  $256, SI; \
	ADDQ  $256, DI; \
	SUBQ  $16, CX; \
	JMP   loop16; \
	; \
done: \
	VMOVDQU (SP), X9; \
	VMOVDQU X9, (DX); \
	VZEROUPPER; \
	RET

// func xtsEncryptVAES(rk *roundKeys, dst, src []byte, tweak *[16]byte)
TEXT ·xtsEncryptVAES(SB), NOSPLIT, $256-64
	VXTS(VAESENC, VAESENCLAST)

// func xtsDecryptVAES(rk *roundKeys, dst, src []byte, tweak *[16]byte)
TEXT ·xtsDecryptVAES(SB), NOSPLIT, $256-64
	VXTS(VAESDEC, VAESDECLAST)
