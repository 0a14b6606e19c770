/* emu_test.h: what the emulation's own tests (test_simt.cpp, test_emu_libs.cpp) share: the check
 * tally, the stand-in for emu::fail, and death tests in a forked child. The C tests' opcheck.h
 * cannot serve here: it is not valid C++ and needs src/ on the include path.
 *
 * It defines emu::fail, so a test program includes it from one source file only. */
#ifndef MGT_EMU_TEST_H
#define MGT_EMU_TEST_H

#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <functional>
#include <string>

#include "emu.h"

namespace emu_test {

inline int g_pass, g_fail;

__attribute__((format(printf, 4, 5))) inline void check(bool ok, const char *file, int line,
                                                        const char *fmt, ...) {
    if (ok) {
        g_pass++;
        return;
    }
    g_fail++;
    va_list ap;
    va_start(ap, fmt);
    std::printf("FAIL %s:%d: ", file, line);
    std::vprintf(fmt, ap);
    std::printf("\n");
    std::fflush(stdout);
    va_end(ap);
}

/* Prints the tally; the process exit status. */
inline int finish(const char *name) {
    if (g_fail)
        std::printf("%s: %d checks FAILED, %d passed\n", name, g_fail, g_pass);
    else
        std::printf("%s: %d checks passed\n", name, g_pass);
    return g_fail ? 1 : 0;
}

/* The exit status of a process that emu::fail ended. */
constexpr int kFailStatus = 70;

struct Death {
    bool failed;     /* ended through emu::fail */
    int status;      /* as waitpid gives it */
    std::string err; /* what it wrote to stderr */
};

/* Runs f in a forked child, which must end through emu::fail. */
inline Death run_child(const std::function<void()> &f) {
    int fds[2];
    if (pipe(fds) != 0)
        return {false, -1, "pipe failed"};
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        f();
        _exit(0);
    }
    close(fds[1]);
    Death d{false, 0, ""};
    char buf[512];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof buf)) > 0)
        d.err.append(buf, (size_t)got);
    close(fds[0]);
    waitpid(pid, &d.status, 0);
    d.failed = WIFEXITED(d.status) && WEXITSTATUS(d.status) == kFailStatus;
    return d;
}

} // namespace emu_test

#define CHECK(cond, ...) ::emu_test::check((cond), __FILE__, __LINE__, __VA_ARGS__)

/* Misuse a real GPU would punish ends the process, with the message on stderr. */
void emu::fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fputs("emulated GPU: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
    std::fflush(stderr);
    _exit(emu_test::kFailStatus);
}

#endif
