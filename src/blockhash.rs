//! The hash of one prefix block's bytes ([`block_hash`]), built for the
//! filter's runtime: WebAssembly with 128-bit SIMD under V8.
//!
//! Algorithm (the accumulation of xxh3, reduced to four 64-bit lanes, with a
//! key schedule instead of a secret table): the input is read in 32-byte
//! stripes of four little-endian words `w[0..4]` (the last stripe zero
//! padded). For stripe `n` and lane `j`, with `k = KEY[j] + n · STEP[j]`:
//!
//! ```text
//! d       = w[j] ⊕ k
//! acc[j] += lo32(d) · hi32(d) + w[j ⊕ 2]      (a 32×32→64-bit product)
//! ```
//!
//! Adding the word of the opposite lane keeps every input bit in the sum
//! even when a product vanishes (`lo32(d) = 0`), as xxh3 does; the key moving
//! with the stripe makes the sum depend on where each stripe is (two swapped
//! stripes give different sums). The four lanes are then folded in order with
//! the length (`h = ((h ⊕ acc[j]) · P).rotl(31)`) and finished with the
//! splitmix64 finalizer, a bijection that spreads every bit over the result.
//!
//! Why not xxh64 or xxh3: per 256-byte block xxh64 runs ~670 wasm
//! instructions (four scalar 64-bit multiply rounds per 32 bytes), and xxh3's
//! fold of its accumulators needs 64×64→128-bit products that wasm32 has no
//! instruction for (a `__multi3` call each). Here a stripe is fourteen SIMD
//! operations (two loads, two xors, two shuffles, two
//! `i64x2.extmul_*_i32x4_u`, four adds, two key steps) and the only 64-bit
//! multiplies are the five of the final fold (`scripts/cost-wasm.sh --fuel`,
//! docs/overhead.md "Sixth session").
//!
//! Three implementations give the same value for every input (tested against
//! each other): WebAssembly `simd128` (the filter's build), SSE2 on x86_64
//! (`_mm_mul_epu32` is exactly `lo32 · hi32` per lane, so the native
//! instruction counts of `scripts/cost.sh` follow the wasm build's work), and
//! a portable scalar one ([`block_hash_scalar`]).
//!
//! Not a cryptographic hash: as with xxh64 before, anyone can make two blocks
//! collide on purpose (the index keeps its own secret for slot placement).
//! Cost: O(len), no allocation.

/// Lane keys of stripe 0 (arbitrary odd constants: xxh3's secret words).
const KEY: [u64; 4] = [
    0xbe4b_a423_396c_feb8,
    0x1cad_2113_07e5_6c45,
    0xdb97_9083_e96d_d4de,
    0x1f10_3c92_f6ac_c9ec,
];
/// Key step per stripe and lane (odd, so stripe keys repeat only after 2^64 stripes).
const STEP: [u64; 4] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_6791_9e37_79f9,
    0x85eb_ca77_c2b2_ae63,
];
/// Initial accumulators.
const INIT: [u64; 4] = [
    0x27d4_eb2f_1656_67c5,
    0x61c8_8647_9e37_79b9,
    0x94d0_49bb_1331_11eb,
    0xbf58_476d_1ce4_e5b9,
];
/// Multiplier of the final fold (odd).
const FOLD: u64 = 0x9fb2_1c65_1e98_df25;

/// The hash of `b` (see the module docs).
#[inline]
pub fn block_hash(b: &[u8]) -> u64 {
    finish(accumulate(b), b.len())
}

/// The scalar reference of [`block_hash`] (the same value everywhere; the
/// SIMD builds are tested against it).
pub fn block_hash_scalar(b: &[u8]) -> u64 {
    let mut acc = INIT;
    let mut key = KEY;
    let mut stripes = b.chunks_exact(32);
    for s in stripes.by_ref() {
        scalar_stripe(&mut acc, &mut key, s);
    }
    let tail = stripes.remainder();
    if !tail.is_empty() {
        scalar_stripe(&mut acc, &mut key, &padded(tail));
    }
    finish(acc, b.len())
}

fn scalar_stripe(acc: &mut [u64; 4], key: &mut [u64; 4], s: &[u8]) {
    let w: [u64; 4] = std::array::from_fn(|j| word(&s[8 * j..]));
    for j in 0..4 {
        let d = w[j] ^ key[j];
        let product = (d & 0xffff_ffff).wrapping_mul(d >> 32);
        acc[j] = acc[j].wrapping_add(product).wrapping_add(w[j ^ 2]);
        key[j] = key[j].wrapping_add(STEP[j]);
    }
}

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

/// The last partial stripe, zero padded (the length, folded in by
/// [`finish`], tells `ab` from `ab\0`).
fn padded(tail: &[u8]) -> [u8; 32] {
    let mut s = [0u8; 32];
    s[..tail.len()].copy_from_slice(tail);
    s
}

/// Fold the lanes in order with the length, then the splitmix64 finalizer.
#[inline]
fn finish(acc: [u64; 4], len: usize) -> u64 {
    let mut h = (len as u64).wrapping_mul(STEP[0]);
    for a in acc {
        h = (h ^ a).wrapping_mul(FOLD).rotate_left(31);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The accumulators after every stripe: WebAssembly SIMD.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline]
fn accumulate(b: &[u8]) -> [u64; 4] {
    use core::arch::wasm32::{
        i32x4_shuffle, i64x2_add, i64x2_extract_lane, u64x2, u64x2_extmul_high_u32x4,
        u64x2_extmul_low_u32x4, v128, v128_load, v128_xor,
    };
    #[inline(always)]
    fn stripe(acc: &mut [v128; 2], key: &mut [v128; 2], step: &[v128; 2], s: &[u8]) {
        let s = &s[..32];
        // SAFETY: `s` holds 32 bytes (sliced above), and `v128_load` has no
        // alignment requirement in WebAssembly.
        let (a, b) = unsafe {
            (
                v128_load(s.as_ptr().cast::<v128>()),
                v128_load(s.as_ptr().add(16).cast::<v128>()),
            )
        };
        let (da, db) = (v128_xor(a, key[0]), v128_xor(b, key[1]));
        // 32-bit halves: lo = [lo(w0), lo(w1), lo(w2), lo(w3)], hi likewise.
        let lo = i32x4_shuffle::<0, 2, 4, 6>(da, db);
        let hi = i32x4_shuffle::<1, 3, 5, 7>(da, db);
        acc[0] = i64x2_add(acc[0], i64x2_add(u64x2_extmul_low_u32x4(lo, hi), b));
        acc[1] = i64x2_add(acc[1], i64x2_add(u64x2_extmul_high_u32x4(lo, hi), a));
        key[0] = i64x2_add(key[0], step[0]);
        key[1] = i64x2_add(key[1], step[1]);
    }
    let mut acc = [u64x2(INIT[0], INIT[1]), u64x2(INIT[2], INIT[3])];
    let mut key = [u64x2(KEY[0], KEY[1]), u64x2(KEY[2], KEY[3])];
    let step = [u64x2(STEP[0], STEP[1]), u64x2(STEP[2], STEP[3])];
    let mut stripes = b.chunks_exact(32);
    for s in stripes.by_ref() {
        stripe(&mut acc, &mut key, &step, s);
    }
    let tail = stripes.remainder();
    if !tail.is_empty() {
        stripe(&mut acc, &mut key, &step, &padded(tail));
    }
    [
        i64x2_extract_lane::<0>(acc[0]) as u64,
        i64x2_extract_lane::<1>(acc[0]) as u64,
        i64x2_extract_lane::<0>(acc[1]) as u64,
        i64x2_extract_lane::<1>(acc[1]) as u64,
    ]
}

/// The accumulators after every stripe: SSE2 (the x86_64 baseline).
#[cfg(target_arch = "x86_64")]
#[inline]
fn accumulate(b: &[u8]) -> [u64; 4] {
    use core::arch::x86_64::{
        __m128i, _mm_add_epi64, _mm_loadu_si128, _mm_mul_epu32, _mm_set_epi64x, _mm_srli_epi64,
        _mm_storeu_si128, _mm_xor_si128,
    };
    #[inline(always)]
    fn stripe(acc: &mut [__m128i; 2], key: &mut [__m128i; 2], step: &[__m128i; 2], s: &[u8]) {
        let s = &s[..32];
        // SAFETY: SSE2 is part of the x86_64 baseline; `s` holds 32 bytes
        // (sliced above) and `_mm_loadu_si128` needs no alignment.
        unsafe {
            let a = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            let b = _mm_loadu_si128(s.as_ptr().add(16).cast::<__m128i>());
            let (da, db) = (_mm_xor_si128(a, key[0]), _mm_xor_si128(b, key[1]));
            // `_mm_mul_epu32` multiplies the low 32 bits of each 64-bit lane.
            let pa = _mm_mul_epu32(da, _mm_srli_epi64::<32>(da));
            let pb = _mm_mul_epu32(db, _mm_srli_epi64::<32>(db));
            acc[0] = _mm_add_epi64(acc[0], _mm_add_epi64(pa, b));
            acc[1] = _mm_add_epi64(acc[1], _mm_add_epi64(pb, a));
            key[0] = _mm_add_epi64(key[0], step[0]);
            key[1] = _mm_add_epi64(key[1], step[1]);
        }
    }
    let pair = |x: [u64; 4], i: usize| {
        // SAFETY: SSE2 (baseline); plain register construction.
        unsafe { _mm_set_epi64x(x[i + 1] as i64, x[i] as i64) }
    };
    let mut acc = [pair(INIT, 0), pair(INIT, 2)];
    let mut key = [pair(KEY, 0), pair(KEY, 2)];
    let step = [pair(STEP, 0), pair(STEP, 2)];
    let mut stripes = b.chunks_exact(32);
    for s in stripes.by_ref() {
        stripe(&mut acc, &mut key, &step, s);
    }
    let tail = stripes.remainder();
    if !tail.is_empty() {
        stripe(&mut acc, &mut key, &step, &padded(tail));
    }
    let mut out = [0u64; 4];
    // SAFETY: SSE2 (baseline); `out` has room for two 16-byte stores.
    unsafe {
        _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), acc[0]);
        _mm_storeu_si128(out.as_mut_ptr().add(2).cast::<__m128i>(), acc[1]);
    }
    out
}

/// The accumulators after every stripe, without SIMD.
#[cfg(not(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
)))]
#[inline]
fn accumulate(b: &[u8]) -> [u64; 4] {
    let mut acc = INIT;
    let mut key = KEY;
    let mut stripes = b.chunks_exact(32);
    for s in stripes.by_ref() {
        scalar_stripe(&mut acc, &mut key, s);
    }
    let tail = stripes.remainder();
    if !tail.is_empty() {
        scalar_stripe(&mut acc, &mut key, &padded(tail));
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Deterministic bytes (an LCG), every value 0..=255.
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn simd_agrees_with_scalar() {
        // Every length across several stripes, with the tail at every size.
        for n in 0..300 {
            for seed in 0..3 {
                let b = bytes(n, seed);
                assert_eq!(block_hash(&b), block_hash_scalar(&b), "len {n} seed {seed}");
            }
        }
        // Long inputs and unaligned starts.
        let big = bytes(5000, 9);
        for start in 0..9 {
            let b = &big[start..];
            assert_eq!(block_hash(b), block_hash_scalar(b), "start {start}");
        }
    }

    #[test]
    fn every_byte_and_position_matters() {
        // Flipping any bit of a 256-byte block, trailing zeros, swapped
        // stripes and a moved word all change the hash.
        let base = bytes(256, 1);
        let h = block_hash(&base);
        let mut seen = std::collections::HashSet::new();
        seen.insert(h);
        for i in 0..base.len() {
            for bit in 0..8 {
                let mut b = base.clone();
                b[i] ^= 1 << bit;
                assert!(seen.insert(block_hash(&b)), "byte {i} bit {bit}");
            }
        }
        let mut padded = base.clone();
        padded.push(0);
        assert!(seen.insert(block_hash(&padded)));
        assert!(seen.insert(block_hash(&base[..255])));
        let mut swapped = base.clone();
        swapped[..32].copy_from_slice(&base[32..64]);
        swapped[32..64].copy_from_slice(&base[..32]);
        assert!(seen.insert(block_hash(&swapped)));
        let mut lanes = base.clone();
        lanes[..8].copy_from_slice(&base[16..24]);
        lanes[16..24].copy_from_slice(&base[..8]);
        assert!(seen.insert(block_hash(&lanes)));
        // The same word where the key makes its product vanish still counts.
        let zero_lo = (KEY[0] & 0xffff_ffff).to_le_bytes();
        let (mut x, mut y) = (vec![0u8; 32], vec![0u8; 32]);
        x[..4].copy_from_slice(&zero_lo[..4]);
        y[..4].copy_from_slice(&zero_lo[..4]);
        x[4] = 1;
        y[4] = 2;
        assert_ne!(block_hash(&x), block_hash(&y));
        // Empty and short inputs differ from each other.
        let shorts: std::collections::HashSet<u64> =
            (0..64).map(|n| block_hash(&vec![0u8; n])).collect();
        assert_eq!(shorts.len(), 64);
    }

    #[test]
    fn no_collisions_among_similar_texts() {
        // 200,000 short texts that differ in a few characters (block-like
        // English): all distinct, and the low 16 bits spread evenly.
        let mut seen = std::collections::HashSet::new();
        let mut buckets = vec![0u32; 1 << 8];
        for i in 0..200_000u32 {
            let t = format!("The user {i} asked about order {} and shipping.", i % 977);
            let h = block_hash(t.as_bytes());
            assert!(seen.insert(h), "collision at {i}");
            buckets[(h & 0xff) as usize] += 1;
        }
        let (lo, hi) = (buckets.iter().min(), buckets.iter().max());
        // 781 per bucket on average; a fair hash stays well within ±20 %.
        assert!(lo > Some(&625) && hi < Some(&940), "{lo:?} {hi:?}");
    }
}
