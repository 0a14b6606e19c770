/* Linked into every program of the sanitized build (tests/sanitize, -DMGT_SANITIZE=ON), nowhere
 * else: a dlclose that leaves the components of Open MPI and PMIx, and hwloc's plugins (through
 * which Open MPI maps the machine), loaded. They are loaded with dlopen and closed in
 * MPI_Finalize, before LeakSanitizer lists what is still allocated at exit; a leak from a closed
 * component shows as "<unknown module>", which no suppression can name. Kept loaded, their
 * frames keep their module's path (.../openmpi3/mca_*.so), which tests/lsan.supp names, and the
 * sanitized suite can take allocation stacks with the fast unwinder (tests/sanitize). Every
 * other library is closed as usual (by the next dlclose in line: the sanitizer runtime's, then
 * the C library's); a program that defines dlclose takes the place of theirs for every library
 * in the process (the linker exports it: CMakeLists.txt). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <string.h>

int dlclose(void *handle) {
    static int (*next)(void *);
    if (!next)
        next = (int (*)(void *))dlsym(RTLD_NEXT, "dlclose");
    struct link_map *map = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name &&
        (strstr(map->l_name, "/openmpi/") || strstr(map->l_name, "/pmix") ||
         strstr(map->l_name, "/hwloc/")))
        return 0;
    return next(handle);
}
