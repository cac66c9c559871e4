#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "euid") == 0) { printf("euid=%d\n", (int)geteuid()); return 0; }
  if (argc > 1 && strcmp(argv[1], "io_uring") == 0) {
    char params[120]; memset(params, 0, sizeof params);
    long fd = syscall(425, 4, params);
    if (fd < 0) { printf("io_uring_setup: %s\n", strerror(errno)); return 1; }
    printf("io_uring_setup: ok\n"); return 0;
  }
  return 2;
}
