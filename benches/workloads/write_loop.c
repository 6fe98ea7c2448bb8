/* Syscall benchmark workload: N write(2) calls of one byte to /dev/null
 * (default 400,000), nothing else. The cheapest real syscall, so what a
 * tracer adds per call dominates. */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 400000;
    int fd = open("/dev/null", O_WRONLY);
    if (fd < 0) return 1;
    for (long i = 0; i < n; i++)
        if (write(fd, "x", 1) != 1) return 1;
    return 0;
}
