/* An allocation-heavy program with a fixed amount of work, for the heap
 * benchmarks: argv[1] rounds of 1,000,000 allocations of 16 to 4096
 * bytes (sizes drawn from a fixed pseudo-random sequence), each replacing
 * a random one of 4096 live blocks, which are touched, so the allocator
 * and the program's use of memory both cost something. Everything is
 * freed at the end. Its own CPU time (user + system) goes to stderr as
 * `cpu_seconds S`, so a profiler's cost inside it can be told apart from
 * the profiler's own, and its context switches as `context_switches
 * VOLUNTARY INVOLUNTARY`: it never blocks by itself, so voluntary switches
 * are waits a profiler made it do (lrnprof's sampler sleeping on a full
 * ring). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static uint64_t state = 0x9e3779b97f4a7c15ull;

static uint64_t next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

__attribute__((noinline)) static char *make_block(size_t n) {
    char *p = malloc(n);
    memset(p, (int)n, n < 64 ? n : 64);
    return p;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 10;
    enum { LIVE = 4096 };
    static char *live[LIVE];
    uint64_t sum = 0;
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < 1000000; i++) {
            uint64_t x = next();
            size_t n = 16 + (x % 4081);
            size_t slot = (x >> 20) % LIVE;
            free(live[slot]);
            live[slot] = make_block(n);
            sum += (uint8_t)live[slot][0];
        }
    }
    for (int i = 0; i < LIVE; i++) free(live[i]);
    printf("%llu\n", (unsigned long long)sum);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "cpu_seconds %.6f\n",
            ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
                ru.ru_stime.tv_usec / 1e6);
    fprintf(stderr, "context_switches %ld %ld\n", ru.ru_nvcsw, ru.ru_nivcsw);
    return 0;
}
