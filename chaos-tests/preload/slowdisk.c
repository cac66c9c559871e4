/* A slow disk for the chaos tool's slow-disk scenario, preloaded (LD_PRELOAD) into an unmodified
 * agent: every fsync, fdatasync and syncfs of the process first sleeps the milliseconds written
 * in the file named by SHOAL_SLOW_DISK_FILE (read at each call; absent, empty or 0: no delay;
 * capped at 60 s). What the process sees is a disk whose flushes take that long. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void slow(void) {
    const char *path = getenv("SHOAL_SLOW_DISK_FILE");
    if (!path) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    char text[16] = {0};
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return;
    long ms = strtol(text, NULL, 10);
    if (ms <= 0) return;
    if (ms > 60000) ms = 60000;
    struct timespec delay = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&delay, &delay) != 0) {
    }
}

#define WRAP(name)                                                        \
    int name(int fd) {                                                    \
        static int (*real)(int);                                          \
        if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, #name);          \
        slow();                                                           \
        return real(fd);                                                  \
    }

WRAP(fsync)
WRAP(fdatasync)
WRAP(syncfs)
