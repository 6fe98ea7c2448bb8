/* Benchmark workload: a short-lived process for the system-wide bench.
 *
 * usage: short_burn [MS]   (default 5)
 *
 * Burns MS milliseconds of its own CPU time and exits, so a system-wide
 * profiler sampling at 1 kHz sees it a few times in its short life. The
 * bench links it under 200 names (sl-001 ... sl-200) and counts which of
 * them the profile names.
 */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    double end = cpu_ms() + (argc > 1 ? atof(argv[1]) : 5.0);
    while (cpu_ms() < end)
        for (unsigned long i = 0; i < 10000; i++) sink += i;
    return 0;
}
