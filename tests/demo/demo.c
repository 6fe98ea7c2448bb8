/* The bundled demo program that `lrnprof-demo` profiles.
 *
 * A small "image pipeline" with a call tree worth looking at:
 *
 *   main thread:  main -> run_pipeline -> decode -> checksum
 *                                      -> transform -> blur_row (inlined at -O2)
 *                                      -> encode -> checksum
 *   thread "compress": compress_worker -> deflate_block -> match_length
 *
 * decode does about twice the work of encode, so checksum's time splits
 * roughly 2:1 between its two callers. Runs for argv[1] seconds (default 2).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile uint64_t sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static uint64_t checksum(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

__attribute__((noinline)) static void decode(uint8_t *buf, size_t n) {
    for (int round = 0; round < 2; round++) sink += checksum(buf, n);
}

static inline void blur_row(uint8_t *row, size_t n) {
    for (size_t i = 1; i + 1 < n; i++) row[i] = (uint8_t)((row[i - 1] + 2 * row[i] + row[i + 1]) / 4);
}

__attribute__((noinline)) static void transform(uint8_t *buf, size_t n) {
    for (size_t off = 0; off < n; off += 4096) blur_row(buf + off, 4096);
}

__attribute__((noinline)) static void encode(uint8_t *buf, size_t n) {
    sink += checksum(buf, n);
}

__attribute__((noinline)) static void run_pipeline(uint8_t *buf, size_t n) {
    decode(buf, n);
    transform(buf, n);
    encode(buf, n);
}

__attribute__((noinline)) static size_t match_length(const uint8_t *a, const uint8_t *b, size_t max) {
    size_t i = 0;
    while (i < max && a[i] == b[i]) i++;
    return i;
}

__attribute__((noinline)) static void deflate_block(const uint8_t *p, size_t n) {
    size_t best = 0;
    for (size_t i = 64; i < n; i += 61) {
        size_t m = match_length(p + i - 64, p + i, n - i < 64 ? n - i : 64);
        if (m > best) best = m;
    }
    sink += best;
}

static double seconds = 2.0;

static void *compress_worker(void *arg) {
    uint8_t *buf = arg;
    double end = now() + seconds;
    while (now() < end) deflate_block(buf, 1 << 20);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) seconds = atof(argv[1]);
    size_t n = 1 << 20;
    uint8_t *buf = malloc(n), *buf2 = malloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = buf2[i] = (uint8_t)(i * 2654435761u >> 13);
    pthread_t t;
    pthread_create(&t, NULL, compress_worker, buf2);
    pthread_setname_np(t, "compress");
    double end = now() + seconds;
    while (now() < end) run_pipeline(buf, n);
    pthread_join(t, NULL);
    printf("demo done (%llu)\n", (unsigned long long)(sink & 0xff));
    return 0;
}
