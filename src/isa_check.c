/* isa_check.c: a binary built for a particular CPU (cmake -DMGT_ARCH=native, x86-64-v3, ...)
 * must not die of SIGILL on a CPU without that instruction set. This file is compiled for the
 * baseline x86-64 whatever MGT_ARCH says (CMakeLists.txt), and checks, before main and before
 * any code built for MGT_ARCH runs, that the CPU has every instruction-set extension the build
 * targets (MGT_ISA_REQUIRED: the compiler's feature macros for MGT_ARCH, found at configure
 * time). If one is missing it says which, in one line, and exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MGT_ISA_REQUIRED
#define MGT_ISA_REQUIRED ""
#endif
#ifndef MGT_ARCH_NAME
#define MGT_ARCH_NAME ""
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
typedef struct {
    const char *name;
    int have;
} isa_feature;

/* __builtin_cpu_supports takes string literals only: one entry per feature the check knows. */
#define ISA(x)                                                                                     \
    { x, __builtin_cpu_supports(x) }

__attribute__((constructor)) static void mgt_isa_check(void) {
    const char *req = MGT_ISA_REQUIRED;
    if (!*req)
        return;
    __builtin_cpu_init();
    const isa_feature known[] = {
        ISA("sse3"),
        ISA("ssse3"),
        ISA("sse4.1"),
        ISA("sse4.2"),
        ISA("popcnt"),
        ISA("avx"),
        ISA("avx2"),
        ISA("fma"),
        ISA("bmi"),
        ISA("bmi2"),
        ISA("f16c"),
        ISA("avx512f"),
        ISA("avx512bw"),
        ISA("avx512dq"),
        ISA("avx512vl"),
        ISA("avx512cd"),
        ISA("avx512vnni"),
        ISA("avx512bf16"),
        ISA("avx512ifma"),
        ISA("avx512vbmi"),
        ISA("avx512vbmi2"),
        ISA("avx512bitalg"),
        ISA("avx512vpopcntdq"),
        ISA("gfni"),
        ISA("vaes"),
        ISA("vpclmulqdq"),
        ISA("amx-tile"),
        ISA("amx-int8"),
        ISA("amx-bf16"),
        ISA("avxvnni"),
    };
    char missing[256] = "";
    char buf[512];
    snprintf(buf, sizeof buf, "%s", req);
    for (char *save = NULL, *f = strtok_r(buf, " ", &save); f; f = strtok_r(NULL, " ", &save))
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (!strcmp(known[i].name, f) && !known[i].have) {
                size_t len = strlen(missing);
                snprintf(missing + len, sizeof missing - len, "%s%s", len ? ", " : "", f);
            }
    if (missing[0]) {
        fprintf(stderr,
                "mgtrain: this binary was built for -march=%s, but this CPU lacks %s; "
                "rebuild it here (cmake -DMGT_ARCH= builds for every x86-64 CPU)\n",
                MGT_ARCH_NAME, missing);
        exit(2);
    }
}
#endif
