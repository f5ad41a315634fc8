// Throughput of the vector instructions the 16-row kernels are made of, on this CPU: each
// instruction alone (8 independent dependency chains, so latency does not bound it), then
// `vpdpbusd` paired with each other one (4 chains each, interleaved): if a pair costs the sum
// of its parts, the two compete for the same execution ports. Loads are measured the same way
// (512-bit, 256-bit, dword broadcast). These are the ceilings `README.md` ("where the rest
// goes") cites for the kernels' one-token and 8-token rates.
//
// Build and run: scripts/bench/isa-rates.sh (gcc -O2 -march=native). Figures are G per second
// of wall time, one thread; pin it and keep the machine quiet.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 100000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Keeps the compiler from folding a chain (values opaque, results live).
#define OPAQUE(...) __asm__ volatile("" ::__VA_ARGS__)

#if defined(__AVX512F__) && defined(__AVX512BW__)
typedef __m512i V;
#define VSET(x) _mm512_set1_epi32(x)
#define VREG "v"
#else
typedef __m256i V;
#define VSET(x) _mm256_set1_epi32(x)
#define VREG "x"
#endif

// X and Y interleaved on 4 chains each: returns G pairs per second.
#define PAIR(X, Y)                                                                           \
    ({                                                                                       \
        V a0 = VSET(1), a1 = VSET(2), a2 = VSET(3), a3 = VSET(4), a4 = VSET(5), a5 = VSET(6), \
          a6 = VSET(7), a7 = VSET(8), b = VSET(0x01020304), c = VSET(0x0f0f0f0f);            \
        double t = now();                                                                    \
        for (long i = 0; i < N / 4; i++) {                                                   \
            OPAQUE(VREG(b), VREG(c));                                                        \
            a0 = X(a0); a4 = Y(a4); a1 = X(a1); a5 = Y(a5);                                  \
            a2 = X(a2); a6 = Y(a6); a3 = X(a3); a7 = Y(a7);                                  \
            OPAQUE(VREG(a0), VREG(a1), VREG(a2), VREG(a3), VREG(a4), VREG(a5), VREG(a6),     \
                   VREG(a7));                                                                \
        }                                                                                    \
        N / (now() - t) / 1e9;                                                               \
    })

// One instruction X on 8 chains (a pair of it with itself): G instructions per second.
#define ALONE(X) (2 * PAIR(X, X))

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define W "zmm"
#define AND(x) _mm512_xor_si512(x, b)
#define TERN(x) _mm512_ternarylogic_epi32(x, b, c, 0xEA)
#define ADD(x) _mm512_add_epi32(x, c)
#define SRL(x) _mm512_srli_epi16(x, 3)
#define SHUFB(x) _mm512_shuffle_epi8(x, c)
#define MADDUBS(x) _mm512_maddubs_epi16(x, c)
#define MADDWD(x) _mm512_madd_epi16(x, c)
#define MULLO(x) _mm512_mullo_epi32(x, c)
#define CVT(x) _mm512_castps_si512(_mm512_cvtepi32_ps(x))
#define MULPS(x) _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(b)))
#define FMA(x)                                                                               \
    _mm512_castps_si512(                                                                     \
        _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(b), _mm512_castsi512_ps(c)))
#define MASKADD(x) _mm512_mask_add_epi8(x, (__mmask64)0x5555555555555555ULL, x, c)
#define TESTADD(x) _mm512_mask_add_epi8(x, _mm512_test_epi8_mask(x, b), x, c)
#ifdef __AVX512VNNI__
#define DPB(x) _mm512_dpbusd_epi32(x, b, c)
#endif
#ifdef __AVX512VBMI__
#define PERMB(x) _mm512_permutexvar_epi8(c, x)
#endif
#ifdef __GFNI__
#define GF(x) _mm512_gf2p8affine_epi64_epi8(x, b, 0)
#endif
#define LOADV(p) _mm512_loadu_si512(p)
#else
#define W "ymm"
#define AND(x) _mm256_xor_si256(x, b)
#define ADD(x) _mm256_add_epi32(x, c)
#define SRL(x) _mm256_srli_epi16(x, 3)
#define SHUFB(x) _mm256_shuffle_epi8(x, c)
#define MADDUBS(x) _mm256_maddubs_epi16(x, c)
#define MADDWD(x) _mm256_madd_epi16(x, c)
#define MULLO(x) _mm256_mullo_epi32(x, c)
#define CVT(x) _mm256_castps_si256(_mm256_cvtepi32_ps(x))
#define MULPS(x) _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(x), _mm256_castsi256_ps(b)))
#define FMA(x)                                                                               \
    _mm256_castps_si256(                                                                     \
        _mm256_fmadd_ps(_mm256_castsi256_ps(x), _mm256_castsi256_ps(b), _mm256_castsi256_ps(c)))
#define LOADV(p) _mm256_loadu_si256((const __m256i *)(p))
#endif

// 16 vector loads, or 16 dword broadcasts, per iteration from an L1-resident buffer, each
// folded into one of 4 chains by one xor: returns G loads per second.
#define LOAD_LOOP(LD)                                                                        \
    ({                                                                                       \
        V s0 = VSET(0), s1 = s0, s2 = s0, s3 = s0;                                           \
        double t = now();                                                                    \
        for (long i = 0; i < N / 16; i++) {                                                  \
            const uint8_t *p = buf + ((i * 1024) & 4095);                                    \
            OPAQUE("r"(p));                                                                  \
            for (int k = 0; k < 16; k += 4) {                                                \
                s0 ^= LD(p, k);                                                              \
                s1 ^= LD(p, k + 1);                                                          \
                s2 ^= LD(p, k + 2);                                                          \
                s3 ^= LD(p, k + 3);                                                          \
            }                                                                                \
            OPAQUE(VREG(s0), VREG(s1), VREG(s2), VREG(s3));                                  \
        }                                                                                    \
        N / (now() - t) / 1e9;                                                               \
    })
#define LD_VEC(p, k) LOADV((p) + sizeof(V) * (k))
#define LD_BCST(p, k) VSET(((const int32_t *)(p))[k])

// The kernels' multiply: `vpdpbusd` with VNNI (AVX-512 kernels), else `vpmaddubsw` (AVX2).
#ifdef DPB
#define REF DPB
#define REF_NAME "vpdpbusd"
#else
#define REF MADDUBS
#define REF_NAME "vpmaddubsw"
#endif

static void row(const char *name, double g, double unit) {
    printf("  %-26s %6.2f G/s  %5.2f x %s\n", name, g, g / unit, REF_NAME);
}

int main(void) {
    uint8_t *buf = aligned_alloc(64, 8192);
    if (!buf) return 1;
    for (int i = 0; i < 8192; i++) buf[i] = (uint8_t)(i * 7);
    double unit = ALONE(REF);
    printf("%s registers, one thread; the reference: %s %.2f G/s\n", W, REF_NAME, unit);
    printf("alone (8 chains):\n");
    row("xor", ALONE(AND), unit);
#ifdef TERN
    row("vpternlogd", ALONE(TERN), unit);
#endif
    row("vpaddd", ALONE(ADD), unit);
    row("vpsrlw", ALONE(SRL), unit);
    row("vpshufb", ALONE(SHUFB), unit);
#ifdef PERMB
    row("vpermb", ALONE(PERMB), unit);
#endif
#ifdef GF
    row("vgf2p8affineqb", ALONE(GF), unit);
#endif
#ifdef MASKADD
    row("vpaddb{k}", ALONE(MASKADD), unit);
    row("vptestmb + vpaddb{k}", ALONE(TESTADD), unit);
#endif
    row("vpmaddubsw", ALONE(MADDUBS), unit);
    row("vpmaddwd", ALONE(MADDWD), unit);
    row("vpmulld", ALONE(MULLO), unit);
    row("vcvtdq2ps", ALONE(CVT), unit);
    row("vmulps", ALONE(MULPS), unit);
    row("vfmadd", ALONE(FMA), unit);
    printf("loads (L1):\n");
    row(W " load", LOAD_LOOP(LD_VEC), unit);
    row("dword broadcast load", LOAD_LOOP(LD_BCST), unit);
    printf("%s + X, interleaved (G pairs/s; 1.00 x: X runs beside it for free, 0.50 x: they "
           "share ports):\n", REF_NAME);
    row("+ xor", PAIR(REF, AND), unit);
#ifdef TERN
    row("+ vpternlogd", PAIR(REF, TERN), unit);
#endif
#ifdef MASKADD
    row("+ vpaddb{k}", PAIR(REF, MASKADD), unit);
#endif
    row("+ vpsrlw", PAIR(REF, SRL), unit);
    row("+ vpshufb", PAIR(REF, SHUFB), unit);
    row("+ vpmaddwd", PAIR(REF, MADDWD), unit);
    row("+ vcvtdq2ps", PAIR(REF, CVT), unit);
    row("+ vmulps", PAIR(REF, MULPS), unit);
    row("+ vfmadd", PAIR(REF, FMA), unit);
#ifdef GF
    row("+ vgf2p8affineqb", PAIR(REF, GF), unit);
#endif
    printf("other pairs:\n");
    row("vpsrlw + vcvtdq2ps", PAIR(SRL, CVT), unit);
    row("vpsrlw + xor", PAIR(SRL, AND), unit);
    free(buf);
    return 0;
}
