/* simd.h: MGT_SIMD, for the hot loops of the CPU backend and the host's data paths.
 *
 * A function marked MGT_SIMD is compiled three times, for x86-64-v4 (AVX-512: 64-bit
 * multiplies, masks and 32 vector registers; GCC still prefers 256-bit vectors there), for
 * x86-64-v3 (AVX2, FMA) and for the build's own target, and the dynamic loader picks one per CPU
 * (GCC's function multi-versioning, an ifunc): one binary runs on every x86-64 CPU and still
 * vectorises its loops 8 wide where it can. Where the build already targets one of these levels
 * (MGT_ARCH=x86-64-v3, native, ...) the levels below it are left out; other compilers and CPUs
 * get the build's target alone. On CPUs of different levels the results of float loops may
 * differ in the last bits (contraction into FMA), as OpenBLAS's kernels do between CPUs; integer
 * loops give the same bits everywhere. Measured on a 2-core AMD EPYC (Zen 4): dropout's
 * counter-based mask, two 64-bit mixes per element, runs 10 times faster in the x86-64-v4
 * variant (vpmullq) than in the x86-64-v3 one, where GCC leaves the 64-bit multiplies scalar. */
#ifndef MGT_SIMD_H
#define MGT_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__AVX2__)
#define MGT_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__AVX512F__)
#define MGT_SIMD __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define MGT_SIMD
#endif

#endif
