/* version.h: what `mgtrain --version` prints: the version, the backends this binary was built
 * with and the libraries they use. */
#ifndef MGT_VERSION_H
#define MGT_VERSION_H

#include <stddef.h>

/* The lines of `mgtrain --version`, each ending in '\n', into buf (cut at n - 1 bytes). */
void mgt_version_text(char *buf, size_t n);

#endif
