/* The gradient codecs' element loops (algorithms/codecs/: half.py, minmax.py, sparse.py),
 * one pass each, equal to their NumPy references to the bit.
 *
 * fp16 (IEEE 754 binary16) from float32: round to nearest, ties to even, magnitudes from
 * 65520 up to infinity, below 2**-25 to zero, subnormals rounded like the rest; a NaN
 * keeps its sign and the top 10 bits of its payload (a payload that would be zero becomes
 * 1), as NumPy's software conversion (npy_floatbits_to_halfbits, the one its float16
 * cast takes on x86-64), so signalling NaNs are not quieted: in integer arithmetic, on
 * a core with F16C only for eight values holding a NaN (the rest by the core's
 * conversion, the same IEEE rounding; NumPy's bit-twiddling costs some ns a value).
 * fp16 to float32 is exact; NaN payloads are shifted back unchanged
 * (npy_halfbits_to_floatbits), F16C for eight codes holding no infinity or NaN.
 *
 * bf16: c10's round_to_nearest_even on the float32 bits, every NaN to 0xFFFF (half.py).
 *
 * int8 (Bagua's MinMaxUInt8, minmax.py): per chunk, from its float32 min and max (found
 * here, but for a chunk whose min or max is zero or NaN: NumPy's choice between -0 and
 * +0, or among NaNs, is its own, so the caller takes those from NumPy), the same
 * float32 operations in the same order as the reference:
 *   scale = 255 / ((max - min) + eps), upper = rint(max * scale), lower = upper - 255,
 *   code = clip(min(rint(x * scale), upper) - lower, 0, 255)   (NaN: the caller's code),
 *   x' = (code + lower) / scale.
 * np.minimum and np.clip propagate NaN, as the selects below do; rintf is round half to
 * even in the default mode, as np.rint. No fused multiply-adds (fp-contract=off) but the
 * decoding's explicit ones, whose results are checked against the division per chunk.
 * Where a chunk's levels are exact float32 integers the codes are made in integers (the
 * same values: minmax_encode_chunk says why).
 *
 * top-k: the k entries of largest magnitude by a three-pass radix select on the
 * magnitudes' bits (11, 11, 10 bits; for non-negative floats the bits order as the
 * values, every NaN made one key above infinity as NumPy's partition puts NaN last),
 * then one pass that writes the indices in increasing order. Where entries equal in
 * magnitude straddle the k-th place the set is not unique (the reference's
 * np.argpartition picks among them), and the kernel returns 0 for the caller to run it.
 */
#pragma GCC optimize("fp-contract=off", "no-math-errno")
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static inline uint32_t f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float bits_f32(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static inline uint16_t half_of_bits(uint32_t f)
{
    const uint32_t a = f & 0x7fffffffu;
    const uint32_t sign = (f >> 16) & 0x8000u;
    /* NaN: 0x7c00 + the payload's top 10 bits, at least 1 */
    uint32_t nan = 0x7c00u | ((a & 0x007fffffu) >> 13);
    nan |= (nan == 0x7c00u);
    /* normal: rebias the exponent by 112, round the 13 dropped bits to even */
    const uint32_t t = a - 0x38000000u;
    const uint32_t normal = (t + 0x0fffu + ((t >> 13) & 1u)) >> 13;
    /* subnormal or zero: (2**23 + m) 2**(e - 150) in units of 2**-24, rounded to even */
    const uint32_t e = a >> 23;
    uint32_t shift = 126u - e; /* 14 to 24 where used; kept in 1..31 elsewhere */
    shift = shift - 1u > 30u ? 31u : shift;
    const uint32_t m = (a & 0x007fffffu) | 0x00800000u;
    const uint32_t sub = (m + ((1u << (shift - 1u)) - 1u) + ((m >> shift) & 1u)) >> shift;
    uint32_t h = a > 0x7f800000u ? nan
               : a >= 0x477ff000u ? 0x7c00u /* 65520 and up, infinity: infinity */
               : a >= 0x38800000u ? normal
               : a >= 0x33000000u ? sub : 0u;
    return (uint16_t)(h | sign);
}

/* Whether the fp16 loops below use the core's conversion (F16C); without it the
 * integer rule alone is no faster than NumPy's, and the caller keeps NumPy's. */
int sb_f16_hardware(void)
{
#ifdef __F16C__
    return 1;
#else
    return 0;
#endif
}

void sb_f16_encode(const float *restrict x, uint16_t *restrict out, size_t n)
{
    size_t i = 0;
#ifdef __F16C__
    /* the core's conversion (IEEE: nearest even, the same codes) eight at a time; a
     * vector holding a NaN is redone by the rule above, which keeps signalling NaNs */
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            for (size_t j = i; j < i + 8; j++)
                out[j] = half_of_bits(f32_bits(x[j]));
        else
            _mm_storeu_si128((__m128i *)(out + i),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    for (; i < n; i++)
        out[i] = half_of_bits(f32_bits(x[i]));
}

static inline float float_of_half(uint32_t v)
{
    const uint32_t sign = (v & 0x8000u) << 16, e = v & 0x7c00u, m = v & 0x03ffu;
    const uint32_t normal = ((v & 0x7fffu) + 0x1c000u) << 13;
    const uint32_t special = 0x7f800000u | (m << 13);
    const uint32_t sub = f32_bits((float)m * 0x1p-24f); /* exact, a normal float */
    const uint32_t r = e == 0 ? sub : e == 0x7c00u ? special : normal;
    return bits_f32(r | sign);
}

void sb_f16_decode(const uint16_t *restrict h, float *restrict out, size_t n)
{
    size_t i = 0;
#ifdef __F16C__
    /* exact either way; eight codes holding a NaN are redone (the core quiets them) */
    const __m128i exponent = _mm_set1_epi16(0x7c00);
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(v, exponent), exponent)))
            for (size_t j = i; j < i + 8; j++)
                out[j] = float_of_half(h[j]);
        else
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(v));
    }
#endif
    for (; i < n; i++)
        out[i] = float_of_half(h[i]);
}

void sb_bf16_encode(const float *restrict x, uint16_t *restrict out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint32_t b = f32_bits(x[i]);
        const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
        out[i] = (b & 0x7fffffffu) > 0x7f800000u ? 0xffffu : (uint16_t)rounded;
    }
}

void sb_bf16_decode(const uint16_t *restrict h, float *restrict out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bits_f32((uint32_t)h[i] << 16);
}

/* scale, upper and lower of a chunk from its [min, max] (minmax.py's _scales) */
static inline void minmax_scales(const float *mm, float *scale, float *upper, float *lower)
{
    *scale = 255.0f / ((mm[1] - mm[0]) + 1e-7f);
    *upper = rintf(mm[1] * *scale);
    *lower = *upper - 255.0f;
}

static inline uint8_t minmax_code(float xi, float scale, float upper, float lower,
                                  uint8_t nan_code)
{
    float level = rintf(xi * scale);
    level = (level < upper || level != level) ? level : upper; /* np.minimum */
    level -= lower;
    const float clipped = level < 0.0f ? 0.0f : level > 255.0f ? 255.0f : level;
    return level != level ? nan_code : (uint8_t)clipped;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define SB_MINMAX_512 1
/* Elements from ``p`` to the next 64-byte boundary (0 to 15), at most ``len``: the 16-lane
 * loops below take that head under a mask so that their full-width loads (or, in the
 * decoding, stores) start on a cache line. NumPy aligns its arrays to 16 bytes only, and
 * a 64-byte access across two lines cost a third of an encode's time here. */
static inline size_t head_to_line(const void *p, size_t len)
{
    const size_t head = ((64 - ((uintptr_t)p & 63)) & 63) / 4;
    return head < len ? head : len;
}

static inline __mmask16 first_lanes(size_t count)
{
    return (__mmask16)((1u << count) - 1u);
}

/* The min and max of a chunk and whether it holds a NaN, sixteen lanes a vector; lanes a
 * masked load leaves out hold x[0], which changes neither. Min and max of non-NaN floats
 * are exact in any order; a NaN sends the chunk to the caller. */
static inline int minmax_scan512(const float *restrict xc, size_t len, float *lo, float *hi)
{
    const __m512 first = _mm512_set1_ps(xc[0]);
    __m512 lo1 = first, hi1 = first, lo2 = first, hi2 = first;
    __mmask16 unordered = _mm512_cmp_ps_mask(first, first, _CMP_UNORD_Q);
    size_t i = head_to_line(xc, len);
    if (i) {
        const __m512 v = _mm512_mask_loadu_ps(first, first_lanes(i), xc);
        lo1 = _mm512_min_ps(lo1, v);
        hi1 = _mm512_max_ps(hi1, v);
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    /* two chains, each load's NaN test and the other's in one unordered comparison */
    for (; i + 32 <= len; i += 32) {
        const __m512 v = _mm512_load_ps(xc + i), w = _mm512_load_ps(xc + i + 16);
        lo1 = _mm512_min_ps(lo1, v);
        hi1 = _mm512_max_ps(hi1, v);
        lo2 = _mm512_min_ps(lo2, w);
        hi2 = _mm512_max_ps(hi2, w);
        unordered |= _mm512_cmp_ps_mask(v, w, _CMP_UNORD_Q);
    }
    if (i < len) {
        const size_t rest = len - i;
        const __mmask16 lanes = rest >= 16 ? (__mmask16)0xFFFF : first_lanes(rest);
        const __m512 v = _mm512_mask_loadu_ps(first, lanes, xc + i);
        lo1 = _mm512_min_ps(lo1, v);
        hi1 = _mm512_max_ps(hi1, v);
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (rest > 16) {
            const __m512 w = _mm512_mask_loadu_ps(first, first_lanes(rest - 16), xc + i + 16);
            lo2 = _mm512_min_ps(lo2, w);
            hi2 = _mm512_max_ps(hi2, w);
            unordered |= _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
        }
    }
    *lo = _mm512_reduce_min_ps(_mm512_min_ps(lo1, lo2));
    *hi = _mm512_reduce_max_ps(_mm512_max_ps(hi1, hi2));
    return unordered != 0;
}

/* clip(level - lower, 0, 255) of sixteen levels, as the 32-bit lanes of codes */
static inline __m512i minmax_levels512(__m512 x, __m512 vscale, __m512i vlower)
{
    return _mm512_sub_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x, vscale)), vlower);
}

/* The integer path of minmax_encode_chunk (same conditions, same codes: see there),
 * sixteen lanes a vector, the loads from a cache line: the masked head, sixty-four a
 * step (two saturating packs and one permutation to put the bytes in order), then
 * sixteen at a time (vpmovusdb saturates an unsigned lane to 255 once max(.,0) took the
 * negative ones to 0). */
static void minmax_encode_chunk512(const float *restrict x, size_t len, float scale,
                                   float lower, uint8_t *restrict codes)
{
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512i vlower = _mm512_set1_epi32((int32_t)lower), zero = _mm512_setzero_si512();
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    size_t i = head_to_line(x, len);
    if (i) {
        const __mmask16 lanes = first_lanes(i);
        const __m512i level = minmax_levels512(_mm512_maskz_loadu_ps(lanes, x), vscale, vlower);
        _mm512_mask_cvtusepi32_storeu_epi8(codes, lanes, _mm512_max_epi32(level, zero));
    }
    for (; i + 64 <= len; i += 64) {
        const __m512i l0 = minmax_levels512(_mm512_load_ps(x + i), vscale, vlower);
        const __m512i l1 = minmax_levels512(_mm512_load_ps(x + i + 16), vscale, vlower);
        const __m512i l2 = minmax_levels512(_mm512_load_ps(x + i + 32), vscale, vlower);
        const __m512i l3 = minmax_levels512(_mm512_load_ps(x + i + 48), vscale, vlower);
        const __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(l0, l1),
                                                  _mm512_packs_epi32(l2, l3));
        _mm512_storeu_si512((void *)(codes + i), _mm512_permutexvar_epi32(order, bytes));
    }
    for (; i < len; i += 16) {
        const __mmask16 lanes = len - i >= 16 ? (__mmask16)0xFFFF : first_lanes(len - i);
        const __m512i level = minmax_levels512(_mm512_maskz_loadu_ps(lanes, x + i), vscale,
                                               vlower);
        _mm512_mask_cvtusepi32_storeu_epi8(codes + i, lanes, _mm512_max_epi32(level, zero));
    }
}
#endif

/* the codes of one chunk of ``len`` values from its scale, upper and lower */
static void minmax_encode_chunk(const float *restrict x, size_t len, float scale, float upper,
                                float lower, uint8_t *restrict codes, uint8_t nan_code,
                                int no_nan)
{
    size_t i = 0;
#ifdef __AVX2__
    /* Thirty-two at a time in integers, for a chunk without NaN (``no_nan``, the fused
     * pass's chunks) whose levels are exact float32 integers (|upper| + 256 < 2**24):
     * vcvtps2dq rounds half to even as rintf in the default mode; every level of the
     * chunk lies in [lower - 1, upper + 1] (x in [min, max], products rounded once), so
     * the float differences level - lower are exact and equal the integer ones, and
     * clip(min(level, upper) - lower, 0, 255) is the saturation of level - lower to
     * [0, 255] that the signed 32-to-16 and unsigned 16-to-8 packs do (upper - lower is
     * 255). The packs work within 128-bit lanes; one permutation puts the codes back in
     * order. Four times fewer instructions than the float path below. */
    if (no_nan && isfinite(scale) && fabsf(upper) + 256.0f < 16777216.0f) {
#ifdef SB_MINMAX_512
        minmax_encode_chunk512(x, len, scale, lower, codes);
        return;
#endif
        const __m256 vscale = _mm256_set1_ps(scale);
        const __m256i vlower = _mm256_set1_epi32((int32_t)lower);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; i + 32 <= len; i += 32) {
            __m256i l0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vscale));
            __m256i l1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vscale));
            __m256i l2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vscale));
            __m256i l3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vscale));
            const __m256i w01 = _mm256_packs_epi32(_mm256_sub_epi32(l0, vlower),
                                                   _mm256_sub_epi32(l1, vlower));
            const __m256i w23 = _mm256_packs_epi32(_mm256_sub_epi32(l2, vlower),
                                                   _mm256_sub_epi32(l3, vlower));
            const __m256i bytes = _mm256_packus_epi16(w01, w23);
            _mm256_storeu_si256((__m256i *)(codes + i),
                                _mm256_permutevar8x32_epi32(bytes, order));
        }
    }
    /* eight at a time where the chunk's scale, upper and lower are finite: then a level
     * is NaN only for a NaN x, and vminps / vmaxps, which return their second operand
     * where one is NaN, propagate it as np.minimum and np.clip do */
    if (isfinite(scale) && isfinite(upper) && isfinite(lower)) {
        const __m256 vscale = _mm256_set1_ps(scale), vupper = _mm256_set1_ps(upper);
        const __m256 vlower = _mm256_set1_ps(lower), zero = _mm256_setzero_ps();
        const __m256 top = _mm256_set1_ps(255.0f);
        const __m256i vnan = _mm256_set1_epi32(nan_code);
        for (; i + 8 <= len; i += 8) {
            __m256 level = _mm256_mul_ps(_mm256_loadu_ps(x + i), vscale);
            level = _mm256_round_ps(level, _MM_FROUND_CUR_DIRECTION);
            level = _mm256_sub_ps(_mm256_min_ps(vupper, level), vlower);
            level = _mm256_min_ps(top, _mm256_max_ps(zero, level));
            const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(level, level, _CMP_UNORD_Q));
            const __m256i whole = _mm256_blendv_epi8(_mm256_cvttps_epi32(level), vnan, nan);
            const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(whole),
                                                   _mm256_extracti128_si256(whole, 1));
            _mm_storel_epi64((__m128i *)(codes + i), _mm_packus_epi16(words, words));
        }
    }
#endif
    for (; i < len; i++)
        codes[i] = minmax_code(x[i], scale, upper, lower, nan_code);
}

/* The codes of ``x`` from every chunk's given [min, max]. */
void sb_minmax_u8_encode(const float *restrict x, size_t n, size_t chunk,
                         const float *restrict minmax, uint8_t *restrict codes,
                         uint8_t nan_code)
{
    for (size_t first = 0, c = 0; first < n; first += chunk, c++) {
        const size_t len = n - first < chunk ? n - first : chunk;
        float scale, upper, lower;
        minmax_scales(minmax + 2 * c, &scale, &upper, &lower);
        minmax_encode_chunk(x + first, len, scale, upper, lower, codes + first, nan_code, 0);
    }
}

/* Every chunk's [min, max] and codes in one read of the chunk, where its min and max are
 * unique bit patterns (no NaN, neither one zero: NumPy's choice between -0 and +0, or
 * among NaNs, is its own); ``ask[c]`` is 1 for the chunks left to the caller (their
 * header and codes not written), else 0; returns how many those are (mostly none, and
 * then the caller need not look at ``ask``). */
size_t sb_minmax_u8_encode_fused(const float *restrict x, size_t n, size_t chunk,
                                 float *restrict minmax, uint8_t *restrict codes,
                                 uint8_t nan_code, uint8_t *restrict ask)
{
    size_t asked = 0;
    for (size_t first = 0, c = 0; first < n; first += chunk, c++) {
        const size_t len = n - first < chunk ? n - first : chunk;
        const float *xc = x + first;
        float lo = xc[0], hi = xc[0];
        int nan = xc[0] != xc[0];
        size_t i = 1;
#ifdef SB_MINMAX_512
        nan = minmax_scan512(xc, len, &lo, &hi);
        i = len;
#elif defined(__AVX2__)
        if (len >= 8) {
            __m256 vlo = _mm256_loadu_ps(xc), vhi = vlo;
            __m256 unordered = _mm256_cmp_ps(vlo, vlo, _CMP_UNORD_Q);
            /* two chains of min and max (and NaN tests), merged after: the loop is bound by
             * their latency, not by loads */
            __m256 vlo2 = vlo, vhi2 = vhi, unordered2 = unordered;
            for (i = 8; i + 16 <= len; i += 16) {
                const __m256 v = _mm256_loadu_ps(xc + i), w = _mm256_loadu_ps(xc + i + 8);
                vlo = _mm256_min_ps(vlo, v);
                vhi = _mm256_max_ps(vhi, v);
                vlo2 = _mm256_min_ps(vlo2, w);
                vhi2 = _mm256_max_ps(vhi2, w);
                unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                unordered2 = _mm256_or_ps(unordered2, _mm256_cmp_ps(w, w, _CMP_UNORD_Q));
            }
            for (; i + 8 <= len; i += 8) {
                const __m256 v = _mm256_loadu_ps(xc + i);
                vlo = _mm256_min_ps(vlo, v);
                vhi = _mm256_max_ps(vhi, v);
                unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            }
            /* a NaN anywhere sends the chunk to the caller, so the order of the merge
             * does not matter: min and max of non-NaN floats are exact */
            vlo = _mm256_min_ps(vlo, vlo2);
            vhi = _mm256_max_ps(vhi, vhi2);
            unordered = _mm256_or_ps(unordered, unordered2);
            float l[8], h[8];
            _mm256_storeu_ps(l, vlo);
            _mm256_storeu_ps(h, vhi);
            lo = l[0], hi = h[0];
            for (int j = 1; j < 8; j++) {
                lo = l[j] < lo ? l[j] : lo;
                hi = h[j] > hi ? h[j] : hi;
            }
            nan = _mm256_movemask_ps(unordered) != 0;
        }
#endif
        for (; i < len; i++) {
            const float v = xc[i];
            nan |= v != v;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        if (nan || lo == 0.0f || hi == 0.0f) {
            ask[c] = 1;
            asked++;
            continue;
        }
        ask[c] = 0;
        minmax[2 * c] = lo;
        minmax[2 * c + 1] = hi;
        float scale, upper, lower;
        minmax_scales(minmax + 2 * c, &scale, &upper, &lower);
        minmax_encode_chunk(xc, len, scale, upper, lower, codes + first, nan_code, 1);
    }
    return asked;
}

#if defined(__AVX2__) && defined(__FMA__)
/* (code + lower) / scale without the division: q = v r with r = 1 / scale, then one
 * correction q + (v - q scale) r, the remainder taken exactly by a fused multiply-add
 * (Markstein's step). It is correctly rounded for most but not provably all v, so a
 * chunk takes it only after :func:`minmax_fast_decode_exact` found it equal to the
 * division, bit for bit, for each of the 256 values a code can decode to (the decoded
 * value depends on the code alone): the result is then the division's for every
 * element. A divide is several times the cost of the three fused operations. */
static inline __m256 minmax_fast_quotient(__m256 v, __m256 vscale, __m256 vinv)
{
    const __m256 q = _mm256_mul_ps(v, vinv);
    return _mm256_fmadd_ps(_mm256_fnmadd_ps(q, vscale, v), vinv, q);
}

/* the values of the eight codes in the low 8 bytes of ``codes`` */
static inline __m256 minmax_fast_decode8(__m128i codes, __m256 vscale, __m256 vlower,
                                         __m256 vinv)
{
    const __m256 whole = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
    return minmax_fast_quotient(_mm256_add_ps(whole, vlower), vscale, vinv);
}
static int minmax_fast_decode_exact(__m256 vscale, __m256 vlower, __m256 vinv)
{
    __m256i code = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    __m256i differ = _mm256_setzero_si256();
    for (int c = 0; c < 256; c += 8) {
        const __m256 v = _mm256_add_ps(_mm256_cvtepi32_ps(code), vlower);
        const __m256i exact = _mm256_castps_si256(_mm256_div_ps(v, vscale));
        const __m256i fast = _mm256_castps_si256(minmax_fast_quotient(v, vscale, vinv));
        differ = _mm256_or_si256(differ, _mm256_xor_si256(exact, fast));
        code = _mm256_add_epi32(code, step);
    }
    return _mm256_testz_si256(differ, differ);
}
#endif

#ifdef SB_MINMAX_512
/* sixteen values of the codes in ``bytes``: minmax_fast_quotient's arithmetic */
static inline __m512 minmax_fast_decode16(__m128i bytes, __m512 vscale, __m512 vlower,
                                          __m512 vinv)
{
    const __m512 v = _mm512_add_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), vlower);
    const __m512 q = _mm512_mul_ps(v, vinv);
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(q, vscale, v), vinv, q);
}

/* Codes ``first`` to ``end`` of a chunk that minmax_fast_decode_exact passed, sixteen
 * lanes a vector with the stores on a cache line (a masked head and tail). */
static void minmax_fast_decode512(const uint8_t *restrict codes, size_t i, size_t end,
                                  __m256 scale, __m256 lower, __m256 inv,
                                  float *restrict out, int accumulate)
{
    const __m512 vscale = _mm512_broadcastss_ps(_mm256_castps256_ps128(scale));
    const __m512 vlower = _mm512_broadcastss_ps(_mm256_castps256_ps128(lower));
    const __m512 vinv = _mm512_broadcastss_ps(_mm256_castps256_ps128(inv));
    const size_t head = head_to_line(out + i, end - i);
    if (head) {
        const __mmask16 lanes = first_lanes(head);
        __m512 value = minmax_fast_decode16(_mm_maskz_loadu_epi8(lanes, codes + i), vscale,
                                            vlower, vinv);
        if (accumulate)
            value = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out + i), value);
        _mm512_mask_storeu_ps(out + i, lanes, value);
        i += head;
    }
    for (; i + 32 <= end; i += 32) {
        __m512 v0 = minmax_fast_decode16(_mm_loadu_si128((const __m128i *)(codes + i)),
                                         vscale, vlower, vinv);
        __m512 v1 = minmax_fast_decode16(_mm_loadu_si128((const __m128i *)(codes + i + 16)),
                                         vscale, vlower, vinv);
        if (accumulate) {
            v0 = _mm512_add_ps(_mm512_load_ps(out + i), v0);
            v1 = _mm512_add_ps(_mm512_load_ps(out + i + 16), v1);
        }
        _mm512_store_ps(out + i, v0);
        _mm512_store_ps(out + i + 16, v1);
    }
    for (; i < end; i += 16) {
        const __mmask16 lanes = end - i >= 16 ? (__mmask16)0xFFFF : first_lanes(end - i);
        __m512 value = minmax_fast_decode16(_mm_maskz_loadu_epi8(lanes, codes + i), vscale,
                                            vlower, vinv);
        if (accumulate)
            value = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out + i), value);
        _mm512_mask_storeu_ps(out + i, lanes, value);
    }
}
#endif

/* ``out = decode`` (accumulate 0) or ``out += decode`` (accumulate 1) */
void sb_minmax_u8_decode(const uint8_t *restrict codes, size_t n, size_t chunk,
                         const float *restrict minmax, float *restrict out, int accumulate)
{
    for (size_t first = 0, c = 0; first < n; first += chunk, c++) {
        const size_t end = n - first < chunk ? n : first + chunk;
        float scale, upper, lower;
        minmax_scales(minmax + 2 * c, &scale, &upper, &lower);
        size_t i = first;
#ifdef __AVX2__
        const __m256 vscale = _mm256_set1_ps(scale), vlower = _mm256_set1_ps(lower);
#ifdef __FMA__
        const __m256 vinv = _mm256_div_ps(_mm256_set1_ps(1.0f), vscale);
        if (end - first >= 512 && minmax_fast_decode_exact(vscale, vlower, vinv)) {
#ifdef SB_MINMAX_512
            minmax_fast_decode512(codes, first, end, vscale, vlower, vinv, out, accumulate);
            continue;
#endif
            /* thirty-two codes a load: a quarter of the loads and widenings of eight */
            for (; i + 32 <= end; i += 32) {
                const __m256i bytes = _mm256_loadu_si256((const __m256i *)(codes + i));
                const __m128i low = _mm256_castsi256_si128(bytes);
                const __m128i high = _mm256_extracti128_si256(bytes, 1);
                __m256 v0 = minmax_fast_decode8(low, vscale, vlower, vinv);
                __m256 v1 = minmax_fast_decode8(_mm_srli_si128(low, 8), vscale, vlower, vinv);
                __m256 v2 = minmax_fast_decode8(high, vscale, vlower, vinv);
                __m256 v3 = minmax_fast_decode8(_mm_srli_si128(high, 8), vscale, vlower, vinv);
                if (accumulate) {
                    v0 = _mm256_add_ps(_mm256_loadu_ps(out + i), v0);
                    v1 = _mm256_add_ps(_mm256_loadu_ps(out + i + 8), v1);
                    v2 = _mm256_add_ps(_mm256_loadu_ps(out + i + 16), v2);
                    v3 = _mm256_add_ps(_mm256_loadu_ps(out + i + 24), v3);
                }
                _mm256_storeu_ps(out + i, v0);
                _mm256_storeu_ps(out + i + 8, v1);
                _mm256_storeu_ps(out + i + 16, v2);
                _mm256_storeu_ps(out + i + 24, v3);
            }
            for (; i + 8 <= end; i += 8) {
                const __m256i whole = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(codes + i)));
                __m256 value = minmax_fast_quotient(
                    _mm256_add_ps(_mm256_cvtepi32_ps(whole), vlower), vscale, vinv);
                if (accumulate)
                    value = _mm256_add_ps(_mm256_loadu_ps(out + i), value);
                _mm256_storeu_ps(out + i, value);
            }
        }
#endif
        for (; i + 8 <= end; i += 8) {
            const __m256i whole = _mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)(codes + i)));
            __m256 value = _mm256_div_ps(_mm256_add_ps(_mm256_cvtepi32_ps(whole), vlower),
                                         vscale);
            if (accumulate)
                value = _mm256_add_ps(_mm256_loadu_ps(out + i), value);
            _mm256_storeu_ps(out + i, value);
        }
#endif
        if (accumulate)
            for (; i < end; i++)
                out[i] += ((float)codes[i] + lower) / scale;
        else
            for (; i < end; i++)
                out[i] = ((float)codes[i] + lower) / scale;
    }
}

static inline uint32_t magnitude_key(uint32_t b)
{
    const uint32_t a = b & 0x7fffffffu;
    return a > 0x7f800000u ? 0x7f800001u : a;
}

/* The bin of the histogram ``hist`` (``bins`` of them) holding the ``k``-th largest key,
 * given ``*above`` keys above the histogram; ``*above`` becomes the count above the bin. */
static uint32_t pick_bin(const size_t *hist, uint32_t bins, size_t k, size_t *above)
{
    uint32_t b = bins;
    while (b > 0) {
        b--;
        if (*above + hist[b] >= k)
            return b;
        *above += hist[b];
    }
    return 0;
}

/* Sorted indices of the ``k`` (1 <= k <= n) entries of ``x`` of largest magnitude into
 * ``idx``, with ``work`` room for n indices; 1 if that set is unique, 0 (``idx``
 * undefined) where ties straddle it. The first pass counts the keys' top 11 bits (four
 * histograms in turn, so that runs of keys in one bin do not wait on each other's
 * counts); the second gathers, in order, the indices of the keys in the k-th key's bin
 * or above (a few k, eight keys compared at a time); the select ends on those. */
int sb_topk_f32(const float *restrict x, size_t n, size_t k, int32_t *restrict idx,
                uint32_t *restrict work)
{
    const uint32_t *bits = (const uint32_t *)x;
    enum { BINS = 2048 };
    size_t hist[4][BINS];
    size_t above = 0;
    memset(hist, 0, sizeof hist);
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int h = 0; h < 4; h++)
            hist[h][magnitude_key(bits[i + h]) >> 21]++;
    for (; i < n; i++)
        hist[0][magnitude_key(bits[i]) >> 21]++;
    for (uint32_t b = 0; b < BINS; b++)
        hist[0][b] += hist[1][b] + hist[2][b] + hist[3][b];
    const uint32_t b1 = pick_bin(hist[0], BINS, k, &above);
    const uint32_t floor1 = b1 << 21;
    size_t m = 0;
    i = 0;
#ifdef __AVX2__
    {
        const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
        /* key >= floor1 as a signed compare: keys and floor1 are below 2**31; a NaN's
         * magnitude is above infinity's, as its key */
        const __m256i below = _mm256_set1_epi32((int32_t)floor1 - 1);
        for (; i + 8 <= n; i += 8) {
            const __m256i v = _mm256_and_si256(
                _mm256_loadu_si256((const __m256i *)(bits + i)), magnitude);
            unsigned mask = (unsigned)_mm256_movemask_ps(
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(v, below)));
            while (mask) {
                work[m++] = (uint32_t)(i + (size_t)__builtin_ctz(mask));
                mask &= mask - 1;
            }
        }
    }
#endif
    for (; i < n; i++)
        if (magnitude_key(bits[i]) >= floor1)
            work[m++] = (uint32_t)i;
    memset(hist[0], 0, sizeof hist[0]);
    for (i = 0; i < m; i++) {
        const uint32_t key = magnitude_key(bits[work[i]]);
        if (key >> 21 == b1)
            hist[0][(key >> 10) & 0x7ffu]++;
    }
    const uint32_t b2 = pick_bin(hist[0], BINS, k, &above);
    const uint32_t prefix = (b1 << 11) | b2;
    memset(hist[0], 0, sizeof hist[0]);
    for (i = 0; i < m; i++) {
        const uint32_t key = magnitude_key(bits[work[i]]);
        if (key >> 10 == prefix)
            hist[0][key & 0x3ffu]++;
    }
    const uint32_t b3 = pick_bin(hist[0], 1024, k, &above);
    if (above + hist[0][b3] != k)
        return 0;
    const uint32_t threshold = (prefix << 10) | b3;
    size_t j = 0;
    for (i = 0; i < m; i++)
        if (magnitude_key(bits[work[i]]) >= threshold)
            idx[j++] = (int32_t)work[i];
    return 1;
}
