/* Benchmark workload for the analyzer: three busy threads, two of them
 * deep, with a fixed amount of work, so that recording it at a high rate
 * gives a trace whose length follows UNITS.
 *
 * usage: deep_threads [UNITS]   (default 1000; one unit is about 1 ms of
 *                                CPU per thread)
 *
 *   "deep-a", "deep-b": worker -> climb x (124..131) -> leaf_even / leaf_odd
 *   "shallow":          worker -> shallow_leaf
 *
 * Each deep thread climbs to a depth that changes every unit (124 to 131
 * frames of climb, each with a 64-byte local array), works in a leaf that
 * depends on the depth, and returns all the way before the next unit. So
 * consecutive samples of a thread share their outer ~120 frames and
 * differ near the leaf, like a deep program doing varied work under a
 * long-lived call chain. Built with -O2 -fomit-frame-pointer -g: only
 * DWARF CFI can unwind it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

static volatile unsigned long sink;
static long units = 1000;

/* About 1 ms of additions. */
#define UNIT_LOOPS 1400000UL

__attribute__((noinline)) void leaf_even(void) {
    for (unsigned long i = 0; i < UNIT_LOOPS; i++) sink += i;
}

__attribute__((noinline)) void leaf_odd(void) {
    for (unsigned long i = 0; i < UNIT_LOOPS; i++) sink += i ^ 1;
}

/* The depth to reach is read through a pointer that stays the same, so the
 * outer frames' bytes do not change from one unit to the next. */
struct goal {
    volatile int top;
};

__attribute__((noinline)) void climb(int level, struct goal *g) {
    volatile char pad[64];
    pad[0] = (char)level;
    if (level < g->top)
        climb(level + 1, g);
    else if (g->top & 1)
        leaf_odd();
    else
        leaf_even();
    /* Using pad after the call keeps this from being a tail call. */
    sink += pad[0];
}

__attribute__((noinline)) void shallow_leaf(void) {
    for (unsigned long i = 0; i < UNIT_LOOPS; i++) sink += i * 3;
}

static void *worker(void *name) {
    pthread_setname_np(pthread_self(), (const char *)name);
    int deep = ((const char *)name)[0] == 'd';
    struct goal g = {0};
    for (long u = 0; u < units; u++) {
        g.top = 124 + (int)(u % 8);
        if (deep)
            climb(0, &g);
        else
            shallow_leaf();
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) units = atol(argv[1]);
    static char *names[3] = {"deep-a", "deep-b", "shallow"};
    pthread_t threads[3];
    for (int i = 0; i < 3; i++)
        if (pthread_create(&threads[i], 0, worker, names[i]) != 0) return 3;
    for (int i = 0; i < 3; i++) pthread_join(threads[i], 0);
    return 0;
}
