/* SHA-256 (FIPS 180-4) for the eventhash core: one call hashes one buffer.
 *
 * On x86-64 processors with the SHA extensions the block function uses them
 * (chosen once, at the first call); elsewhere a portable C block function runs.
 * hashlib's digest objects cost more to make than a short event costs to hash,
 * and events are hashed twice each on persist (streamrep_sha256_pair hashes the
 * two together), hence a function of our own.
 */
#ifndef STREAMREP_SHA256_H
#define STREAMREP_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static const uint32_t streamrep_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define STREAMREP_ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

/* Process *blocks* 64-byte blocks of *data* into *state*: the portable way. */
static void streamrep_sha256_blocks_c(uint32_t state[8], const unsigned char *data,
                                      size_t blocks) {
    uint32_t w[64];
    while (blocks--) {
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        int t;
        for (t = 0; t < 16; t++) {
            const unsigned char *p = data + 4 * t;
            w[t] = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
        }
        for (t = 16; t < 64; t++) {
            uint32_t s0 = STREAMREP_ROTR(w[t - 15], 7) ^ STREAMREP_ROTR(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = STREAMREP_ROTR(w[t - 2], 17) ^ STREAMREP_ROTR(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        for (t = 0; t < 64; t++) {
            uint32_t s1 = STREAMREP_ROTR(e, 6) ^ STREAMREP_ROTR(e, 11) ^ STREAMREP_ROTR(e, 25);
            uint32_t ch = (e & f) ^ (~e & g);
            uint32_t t1 = h + s1 + ch + streamrep_sha256_k[t] + w[t];
            uint32_t s0 = STREAMREP_ROTR(a, 2) ^ STREAMREP_ROTR(a, 13) ^ STREAMREP_ROTR(a, 22);
            uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
            uint32_t t2 = s0 + maj;
            h = g; g = f; f = e; e = d + t1;
            d = c; c = b; b = a; a = t1 + t2;
        }
        state[0] += a; state[1] += b; state[2] += c; state[3] += d;
        state[4] += e; state[5] += f; state[6] += g; state[7] += h;
        data += 64;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STREAMREP_SHA256_HAVE_NI 1

/* Four rounds with the SHA extensions, group *i* (0 to 15) of a block at *data*:
 * the message schedule is kept in m[4] (each new group of four words from the four
 * before), the state in s0 (A B E F) and s1 (C D G H). */
#define STREAMREP_SHA256_NI_ROUNDS(s0, s1, m, i, data) do {                          \
    __m128i words_, k_;                                                              \
    if ((i) < 4) {                                                                   \
        words_ = _mm_shuffle_epi8(                                                   \
            _mm_loadu_si128((const __m128i *)((data) + 16 * (i))), byteswap);        \
    } else {                                                                         \
        __m128i t_ = _mm_sha256msg1_epu32(m[(i) & 3], m[((i) + 1) & 3]);             \
        t_ = _mm_add_epi32(t_, _mm_alignr_epi8(m[((i) + 3) & 3], m[((i) + 2) & 3], 4)); \
        words_ = _mm_sha256msg2_epu32(t_, m[((i) + 3) & 3]);                         \
    }                                                                                \
    m[(i) & 3] = words_;                                                             \
    k_ = _mm_add_epi32(words_,                                                       \
                       _mm_loadu_si128((const __m128i *)&streamrep_sha256_k[4 * (i)])); \
    s1 = _mm_sha256rnds2_epu32(s1, s0, k_);                                          \
    k_ = _mm_shuffle_epi32(k_, 0x0E);                                                \
    s0 = _mm_sha256rnds2_epu32(s0, s1, k_);                                          \
} while (0)

/* state[8] (A to H) into the registers' order, and back. */
#define STREAMREP_SHA256_NI_LOAD(state, s0, s1) do {                                 \
    __m128i t_ = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&(state)[0]), 0xB1); \
    s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&(state)[4]), 0x1B);     \
    s0 = _mm_alignr_epi8(t_, s1, 8);                                                 \
    s1 = _mm_blend_epi16(s1, t_, 0xF0);                                              \
} while (0)
#define STREAMREP_SHA256_NI_STORE(state, s0, s1) do {                                \
    __m128i t_ = _mm_shuffle_epi32(s0, 0x1B);                                        \
    __m128i u_ = _mm_shuffle_epi32(s1, 0xB1);                                        \
    _mm_storeu_si128((__m128i *)&(state)[0], _mm_blend_epi16(t_, u_, 0xF0));         \
    _mm_storeu_si128((__m128i *)&(state)[4], _mm_alignr_epi8(u_, t_, 8));            \
} while (0)

/* The same with the SHA extensions, four rounds at a time. */
__attribute__((target("sha,sse4.1,ssse3")))
static void streamrep_sha256_blocks_ni(uint32_t state[8], const unsigned char *data,
                                       size_t blocks) {
    const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i state0, state1;
    STREAMREP_SHA256_NI_LOAD(state, state0, state1);
    while (blocks--) {
        __m128i abef = state0, cdgh = state1, m[4];
        int i;
        for (i = 0; i < 16; i++) {
            STREAMREP_SHA256_NI_ROUNDS(state0, state1, m, i, data);
        }
        state0 = _mm_add_epi32(state0, abef);
        state1 = _mm_add_epi32(state1, cdgh);
        data += 64;
    }
    STREAMREP_SHA256_NI_STORE(state, state0, state1);
}

/* One block of each of two messages, their rounds interleaved: a round's result
 * feeds the next round of its own message only, so while one message's round
 * waits for the one before, the other's runs (about 1.5 times the speed of one
 * block after the other). */
__attribute__((target("sha,sse4.1,ssse3")))
static void streamrep_sha256_two_blocks_ni(uint32_t state_a[8], const unsigned char *a,
                                           uint32_t state_b[8], const unsigned char *b) {
    const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i a0, a1, b0, b1, start_a0, start_a1, start_b0, start_b1, ma[4], mb[4];
    int i;
    STREAMREP_SHA256_NI_LOAD(state_a, a0, a1);
    STREAMREP_SHA256_NI_LOAD(state_b, b0, b1);
    start_a0 = a0; start_a1 = a1; start_b0 = b0; start_b1 = b1;
    for (i = 0; i < 16; i++) {
        STREAMREP_SHA256_NI_ROUNDS(a0, a1, ma, i, a);
        STREAMREP_SHA256_NI_ROUNDS(b0, b1, mb, i, b);
    }
    a0 = _mm_add_epi32(a0, start_a0);
    a1 = _mm_add_epi32(a1, start_a1);
    b0 = _mm_add_epi32(b0, start_b0);
    b1 = _mm_add_epi32(b1, start_b1);
    STREAMREP_SHA256_NI_STORE(state_a, a0, a1);
    STREAMREP_SHA256_NI_STORE(state_b, b0, b1);
}
#endif

typedef void (*streamrep_sha256_blocks_fn)(uint32_t *, const unsigned char *, size_t);

static streamrep_sha256_blocks_fn streamrep_sha256_blocks = NULL;

/* 1 when the SHA extensions are used, 0 when the portable function is. */
static int streamrep_sha256_accelerated(void) {
    if (streamrep_sha256_blocks == NULL) {
        streamrep_sha256_blocks = streamrep_sha256_blocks_c;
#ifdef STREAMREP_SHA256_HAVE_NI
        __builtin_cpu_init();
        if (__builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1")
                && __builtin_cpu_supports("ssse3")) {
            streamrep_sha256_blocks = streamrep_sha256_blocks_ni;
        }
#endif
    }
    return streamrep_sha256_blocks != streamrep_sha256_blocks_c;
}

/* Force the portable block function (1) or choose again (0): for tests. */
static void streamrep_sha256_force_portable(int portable) {
    streamrep_sha256_blocks = portable ? streamrep_sha256_blocks_c : NULL;
    if (!portable) {
        streamrep_sha256_accelerated();
    }
}

/* A message as SHA-256 reads it: its whole 64-byte blocks where they are, then
 * the padded tail (the last partial block, 0x80, zeros, the length in bits). */
typedef struct {
    const unsigned char *data;
    size_t full;    /* whole blocks at data */
    size_t blocks;  /* full and the tail's one or two */
    unsigned char tail[128];
} streamrep_sha256_message;

static void streamrep_sha256_prepare(streamrep_sha256_message *m, const unsigned char *data,
                                     size_t len) {
    size_t rest = len % 64, tail_len;
    uint64_t bits = (uint64_t)len * 8;
    int i;
    m->data = data;
    m->full = len / 64;
    memcpy(m->tail, data + m->full * 64, rest);
    m->tail[rest] = 0x80;
    tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
    memset(m->tail + rest + 1, 0, tail_len - rest - 1 - 8);
    for (i = 0; i < 8; i++) {
        m->tail[tail_len - 1 - i] = (unsigned char)(bits >> (8 * i));
    }
    m->blocks = m->full + tail_len / 64;
}

static inline const unsigned char *streamrep_sha256_block(const streamrep_sha256_message *m,
                                                          size_t i) {
    return i < m->full ? m->data + 64 * i : m->tail + 64 * (i - m->full);
}

static void streamrep_sha256_init(uint32_t state[8]) {
    static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(state, initial, sizeof(initial));
}

/* Blocks *from* to the last of *m* into *state*. */
static void streamrep_sha256_rest(uint32_t state[8], const streamrep_sha256_message *m,
                                  size_t from) {
    if (from < m->full) {
        streamrep_sha256_blocks(state, m->data + 64 * from, m->full - from);
        from = m->full;
    }
    if (from < m->blocks) {
        streamrep_sha256_blocks(state, m->tail + 64 * (from - m->full), m->blocks - from);
    }
}

static void streamrep_sha256_digest(const uint32_t state[8], unsigned char out[32]) {
    int i;
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(state[i] >> 24);
        out[4 * i + 1] = (unsigned char)(state[i] >> 16);
        out[4 * i + 2] = (unsigned char)(state[i] >> 8);
        out[4 * i + 3] = (unsigned char)state[i];
    }
}

/* out[32] = SHA-256 of data[0:len]. */
static void streamrep_sha256(const unsigned char *data, size_t len, unsigned char out[32]) {
    uint32_t state[8];
    streamrep_sha256_message m;
    if (streamrep_sha256_blocks == NULL) {
        streamrep_sha256_accelerated();
    }
    streamrep_sha256_prepare(&m, data, len);
    streamrep_sha256_init(state);
    streamrep_sha256_rest(state, &m, 0);
    streamrep_sha256_digest(state, out);
}

/* out_a[32] and out_b[32] = SHA-256 of a[0:len_a] and of b[0:len_b]: with the SHA
 * extensions, the blocks the two have in number are hashed two at a time. */
static void streamrep_sha256_pair(const unsigned char *a, size_t len_a, unsigned char out_a[32],
                                  const unsigned char *b, size_t len_b,
                                  unsigned char out_b[32]) {
    uint32_t state_a[8], state_b[8];
    streamrep_sha256_message ma, mb;
    size_t i = 0;
    if (streamrep_sha256_blocks == NULL) {
        streamrep_sha256_accelerated();
    }
    streamrep_sha256_prepare(&ma, a, len_a);
    streamrep_sha256_prepare(&mb, b, len_b);
    streamrep_sha256_init(state_a);
    streamrep_sha256_init(state_b);
#ifdef STREAMREP_SHA256_HAVE_NI
    if (streamrep_sha256_blocks == streamrep_sha256_blocks_ni) {
        for (; i < ma.blocks && i < mb.blocks; i++) {
            streamrep_sha256_two_blocks_ni(state_a, streamrep_sha256_block(&ma, i),
                                           state_b, streamrep_sha256_block(&mb, i));
        }
    }
#endif
    streamrep_sha256_rest(state_a, &ma, i);
    streamrep_sha256_rest(state_b, &mb, i);
    streamrep_sha256_digest(state_a, out_a);
    streamrep_sha256_digest(state_b, out_b);
}

#endif
