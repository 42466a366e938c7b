//! The hash of one prefix block's bytes ([`block_hash`]), built for the
//! filter's runtime: WebAssembly with 128-bit SIMD under V8.
//!
//! Algorithm (xxh3's accumulation with UMAC's NH pairing, four 64-bit
//! lanes): the input is read in 32-byte stripes of four little-endian words
//! `w[0..4]`, eight stripes to a 256-byte round (the last stripe zero
//! padded). Stripe `s` of a round has its own keys `k = KEYS[s]`; with
//! `d[j] = w[j] ⊕ k[j]`, `lo`/`hi` the 32-bit halves:
//!
//! ```text
//! acc[0] += lo(d[0]) · lo(d[2]) + w[2]     acc[2] += lo(d[1]) · lo(d[3]) + w[0]
//! acc[1] += hi(d[0]) · hi(d[2]) + w[3]     acc[3] += hi(d[1]) · hi(d[3]) + w[1]
//! ```
//!
//! (32×32→64-bit products of halves of different words). Adding the raw
//! words keeps every input bit in the sums even when a product vanishes, as
//! xxh3 does; the per-stripe keys make the sums depend on where a stripe is
//! in its round, and a scramble after each whole round (`acc = (acc ⊕
//! acc >> 47) · SCRAMBLE`) on which round it is in. The four lanes are then
//! folded in order with the length (`h = ((h ⊕ acc[j]) · P).rotl(31)`) and
//! finished with the splitmix64 finalizer.
//!
//! Why not xxh64 or xxh3: per 256-byte block xxh64 runs ~670 wasm
//! instructions (four scalar 64-bit multiply rounds per 32 bytes), and xxh3's
//! fold of its accumulators needs 64×64→128-bit products that wasm32 has no
//! instruction for (a `__multi3` call each). Here a stripe is two loads, two
//! xors with constant keys, two `i64x2.extmul_{low,high}_i32x4_u` (which read
//! 32-bit lanes 0–1 and 2–3 of both operands: no shuffle, which V8 lowered
//! slowly in a first version) and four adds; ~330 wasm instructions per
//! 256-byte block (`scripts/cost-wasm.sh --fuel keyblock/16k`,
//! docs/overhead.md "Sixth session").
//!
//! Three implementations give the same value for every input (tested against
//! each other): WebAssembly `simd128` (the filter's build), SSE2 on x86_64
//! (`_mm_mul_epu32` after a lane spread), and a portable scalar one
//! ([`block_hash_scalar`]). [`block_hash_ascii`] and [`block_hash_plain`]
//! are the same hash with a test of the bytes riding along.
//!
//! Not a cryptographic hash: as with xxh64 before, anyone can make two blocks
//! collide on purpose (the index keeps its own secret for slot placement).
//! Cost: O(len), no allocation.

/// Stripes per round: a round has its own key per stripe and lane
/// ([`KEYS`]), and rounds are told apart by [`Lanes::scramble`].
const ROUND: usize = 8;
/// Bytes per stripe.
const STRIPE: usize = 32;

/// The key of stripe `s` of a round, lane `j`: `KEYS[s][j]`, a splitmix64
/// sequence (fixed, public: this is not a keyed hash).
const KEYS: [[u64; 4]; ROUND] = {
    let mut k = [[0u64; 4]; ROUND];
    let mut x: u64 = 0x7072_6566_6978_6b65;
    let mut i = 0;
    while i < ROUND * 4 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        k[i / 4][i % 4] = z ^ (z >> 31);
        i += 1;
    }
    k
};
/// Initial accumulators.
const INIT: [u64; 4] = [
    0x27d4_eb2f_1656_67c5,
    0x61c8_8647_9e37_79b9,
    0x94d0_49bb_1331_11eb,
    0xbf58_476d_1ce4_e5b9,
];
/// The 32-bit odd multiplier of the scramble between rounds (xxh3's
/// `PRIME32_1`): a 64×32-bit product, cheap without a 64-bit SIMD multiply.
const SCRAMBLE: u64 = 0x9e37_79b1;
/// Multiplier of the final fold (odd).
const FOLD: u64 = 0x9fb2_1c65_1e98_df25;

/// The hash of `b` (see the module docs).
#[inline]
pub fn block_hash(b: &[u8]) -> u64 {
    let (acc, _) = run::<Simd>(b);
    finish(acc, b.len())
}

/// [`block_hash`] of `b` if every byte of it is ASCII (below 0x80), else
/// `None`; the test rides along with the hash (one vector or per 16 bytes),
/// so a whole ASCII block costs no separate pass to count its characters.
#[inline]
pub fn block_hash_ascii(b: &[u8]) -> Option<u64> {
    let (acc, high) = run::<Simd>(b);
    (!high).then(|| finish(acc, b.len()))
}

/// [`block_hash`] of `b` if `b` is plain JSON string text: no byte 0x80 or
/// above, no `"`, `\\` or control byte (so the raw JSON bytes are the text
/// itself, one character each); else `None`, at the end of the 256-byte
/// round holding the first such byte (a failed try reads at most one round
/// more than the scan that must then find that byte). The JSON walk hands whole
/// blocks of a string's raw bytes straight to the hasher this way
/// ([`crate::hash::PrefixHasher::push_plain_blocks`]): the scan for the
/// string's end, the character count and the hash in one pass.
#[inline]
pub fn block_hash_plain(b: &[u8]) -> Option<u64> {
    let (acc, _) = run_checked::<Simd, true>(b)?;
    Some(finish(acc, b.len()))
}

/// [`block_hash_plain`] of one whole round (the routing key's 256-byte
/// block, [`crate::hash::BLOCK_UNITS`]): the same value and the same `None`.
/// Built for the JSON walk's bulk path, where nearly every block of a long
/// prompt comes through here. In the WebAssembly build the sixteen vectors
/// are loaded once at constant offsets from one pointer (no slicing, so no
/// bounds checks and no address arithmetic per load), tested first with two
/// running minima (see [`plain_round_simd`]: 4 vector operations per 16
/// bytes instead of 6 for the compare-and-or test), then hashed from the
/// registers; no code for partial rounds. Elsewhere it is
/// [`block_hash_plain`].
#[inline]
pub fn block_hash_plain_round(b: &[u8; ROUND * STRIPE]) -> Option<u64> {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        plain_round_simd(b)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        block_hash_plain(b)
    }
}

/// [`block_hash_plain_round`] with WebAssembly SIMD. The class test: with
/// `x = v ⊕ 0x02`, a byte is below 0x20, `"` (0x22) or 0x80 and above
/// exactly when `x`, read as a signed byte, is below 0x21 (`⊕ 0x02` maps
/// [0, 0x20) onto itself and `"` to 0x20, and keeps the top bit); it is `\`
/// exactly when `v ⊕ 0x5C` is 0. So the signed minimum of the `x`s and the
/// unsigned minimum of the `v ⊕ 0x5C`s over the block tell whether any byte
/// is flagged: two xors and two minima per vector, two compares per block.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline(always)]
fn plain_round_simd(b: &[u8; ROUND * STRIPE]) -> Option<u64> {
    use core::arch::wasm32::{
        i8x16_lt, i8x16_min, i8x16_splat, u8x16_eq, u8x16_min, u8x16_splat, v128, v128_any_true,
        v128_or, v128_xor,
    };
    // SAFETY: `b` is 256 bytes = 16 vectors, read unaligned.
    let v: [v128; 16] = unsafe { b.as_ptr().cast::<[v128; 16]>().read_unaligned() };
    let (q, bs) = (u8x16_splat(0x02), u8x16_splat(b'\\'));
    let (mut low, mut back) = (v128_xor(v[0], q), v128_xor(v[0], bs));
    for x in &v[1..] {
        low = i8x16_min(low, v128_xor(*x, q));
        back = u8x16_min(back, v128_xor(*x, bs));
    }
    let flagged = v128_or(
        i8x16_lt(low, i8x16_splat(0x21)),
        u8x16_eq(back, u8x16_splat(0)),
    );
    if v128_any_true(flagged) {
        return None;
    }
    let mut l = Simd::new();
    for k in 0..ROUND {
        l.stripe_v(v[2 * k], v[2 * k + 1], k);
    }
    l.scramble();
    Some(finish(l.lanes().0, ROUND * STRIPE))
}

/// The scalar reference of [`block_hash`] (the same value everywhere; the
/// SIMD builds are tested against it).
pub fn block_hash_scalar(b: &[u8]) -> u64 {
    let (acc, _) = run::<Scalar>(b);
    finish(acc, b.len())
}

/// Four 64-bit accumulator lanes (and the OR of every byte seen).
trait Lanes {
    fn new() -> Self;
    /// Add the 32-byte stripe `s[..32]` with the keys of stripe `k` of a
    /// round; with `PLAIN`, also flag JSON specials (`"`, `\\`, below 0x20).
    fn stripe<const PLAIN: bool>(&mut self, s: &[u8], k: usize);
    /// Whether a flagged byte (0x80 or above; a special with `PLAIN`) was seen.
    fn flagged(&self) -> bool;
    /// Between rounds: `acc = (acc ⊕ acc >> 47) · SCRAMBLE` per lane.
    fn scramble(&mut self);
    /// The lanes, and whether any byte was 0x80 or above.
    fn lanes(&self) -> ([u64; 4], bool);
}

/// The stripes of `b`: whole rounds of [`ROUND`] stripes (unrolled: the keys
/// are constants), each followed by a scramble; then the stripes of the last
/// partial round, the last one zero padded (the length, folded in by
/// [`finish`], tells `ab` from `ab\0`).
#[inline(always)]
fn run<L: Lanes>(b: &[u8]) -> ([u64; 4], bool) {
    let acc = run_checked::<L, false>(b);
    // Without `PLAIN` nothing stops the run early.
    acc.unwrap_or(([0; 4], true))
}

/// [`run`]; with `PLAIN`, `None` as soon as a stripe holds a flagged byte.
#[inline(always)]
fn run_checked<L: Lanes, const PLAIN: bool>(b: &[u8]) -> Option<([u64; 4], bool)> {
    let mut l = L::new();
    // With `PLAIN`, the flag is tested after each round (and at the end):
    // a failed try reads at most one round past the first flagged byte.
    macro_rules! stripe {
        ($s:expr, $k:expr) => {
            l.stripe::<PLAIN>($s, $k)
        };
    }
    let mut rounds = b.chunks_exact(ROUND * STRIPE);
    for r in rounds.by_ref() {
        // Written out: LLVM keeps a loop of eight here, with the keys loaded
        // from a table instead of constants (~15 % more wasm instructions).
        stripe!(r, 0);
        stripe!(&r[STRIPE..], 1);
        stripe!(&r[2 * STRIPE..], 2);
        stripe!(&r[3 * STRIPE..], 3);
        stripe!(&r[4 * STRIPE..], 4);
        stripe!(&r[5 * STRIPE..], 5);
        stripe!(&r[6 * STRIPE..], 6);
        stripe!(&r[7 * STRIPE..], 7);
        if PLAIN && l.flagged() {
            return None;
        }
        l.scramble();
    }
    let mut stripes = rounds.remainder().chunks_exact(STRIPE);
    let mut k = 0;
    for s in stripes.by_ref() {
        stripe!(s, k);
        k += 1;
    }
    let tail = stripes.remainder();
    if !tail.is_empty() {
        // The zero padding is no special: test the tail's own bytes.
        if PLAIN && crate::bytescan::find(tail, [b'"', b'\\'], 0x20).is_some() {
            return None;
        }
        let mut s = [0u8; STRIPE];
        s[..tail.len()].copy_from_slice(tail);
        l.stripe::<false>(&s, k);
    }
    if PLAIN && l.flagged() {
        return None;
    }
    Some(l.lanes())
}

/// Fold the lanes in order with the length, then the splitmix64 finalizer.
#[inline]
fn finish(acc: [u64; 4], len: usize) -> u64 {
    let mut h = (len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for a in acc {
        h = (h ^ a).wrapping_mul(FOLD).rotate_left(31);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The portable lanes (and the reference the SIMD ones are tested against).
struct Scalar {
    acc: [u64; 4],
    or: u64,
}

impl Lanes for Scalar {
    fn new() -> Self {
        Scalar { acc: INIT, or: 0 }
    }

    #[inline(always)]
    fn stripe<const PLAIN: bool>(&mut self, s: &[u8], k: usize) {
        if PLAIN && crate::bytescan::find_swar(&s[..STRIPE], [b'"', b'\\'], 0x20).is_some() {
            self.or |= 0x80;
        }
        let w: [u64; 4] = std::array::from_fn(|j| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&s[8 * j..8 * j + 8]);
            u64::from_le_bytes(x)
        });
        let d: [u64; 4] = std::array::from_fn(|j| w[j] ^ KEYS[k][j]);
        let (lo, hi) = (|x: u64| x & 0xffff_ffff, |x: u64| x >> 32);
        let products = [
            lo(d[0]) * lo(d[2]),
            hi(d[0]) * hi(d[2]),
            lo(d[1]) * lo(d[3]),
            hi(d[1]) * hi(d[3]),
        ];
        for j in 0..4 {
            self.acc[j] = self.acc[j].wrapping_add(products[j]).wrapping_add(w[j ^ 2]);
            self.or |= w[j];
        }
    }

    #[inline(always)]
    fn scramble(&mut self) {
        for a in &mut self.acc {
            *a = (*a ^ (*a >> 47)).wrapping_mul(SCRAMBLE);
        }
    }

    fn flagged(&self) -> bool {
        self.or & 0x8080_8080_8080_8080 != 0
    }

    fn lanes(&self) -> ([u64; 4], bool) {
        (self.acc, self.flagged())
    }
}

/// The lanes of this build: WebAssembly SIMD, SSE2 or [`Scalar`].
#[cfg(not(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
)))]
type Simd = Scalar;

/// WebAssembly SIMD lanes: `acc[0]` holds lanes 0 and 1, `acc[1]` lanes 2 and 3.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
struct Simd {
    acc: [core::arch::wasm32::v128; 2],
    or: core::arch::wasm32::v128,
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
impl Lanes for Simd {
    #[inline(always)]
    fn new() -> Self {
        use core::arch::wasm32::{u64x2, u64x2_splat};
        Simd {
            acc: [u64x2(INIT[0], INIT[1]), u64x2(INIT[2], INIT[3])],
            or: u64x2_splat(0),
        }
    }

    #[inline(always)]
    fn stripe<const PLAIN: bool>(&mut self, s: &[u8], k: usize) {
        use crate::bytescan::simd::matches;
        use core::arch::wasm32::{v128, v128_load, v128_or};
        let s = &s[..STRIPE];
        // SAFETY: `s` holds 32 bytes (sliced above), and `v128_load` has no
        // alignment requirement in WebAssembly.
        let (a, b) = unsafe {
            (
                v128_load(s.as_ptr().cast::<v128>()),
                v128_load(s.as_ptr().add(16).cast::<v128>()),
            )
        };
        self.stripe_v(a, b, k);
        self.or = v128_or(self.or, v128_or(a, b));
        if PLAIN {
            let special = v128_or(
                matches(s, [b'"', b'\\'], 0x20),
                matches(&s[16..], [b'"', b'\\'], 0x20),
            );
            self.or = v128_or(self.or, special);
        }
    }

    #[inline(always)]
    fn flagged(&self) -> bool {
        core::arch::wasm32::u8x16_bitmask(self.or) != 0
    }

    #[inline(always)]
    fn scramble(&mut self) {
        use core::arch::wasm32::{i64x2_mul, u64x2_shr, u64x2_splat, v128_xor};
        for a in &mut self.acc {
            *a = i64x2_mul(v128_xor(*a, u64x2_shr(*a, 47)), u64x2_splat(SCRAMBLE));
        }
    }

    #[inline(always)]
    fn lanes(&self) -> ([u64; 4], bool) {
        use core::arch::wasm32::i64x2_extract_lane;
        let lane = |v, i| {
            if i == 0 {
                i64x2_extract_lane::<0>(v) as u64
            } else {
                i64x2_extract_lane::<1>(v) as u64
            }
        };
        (
            [
                lane(self.acc[0], 0),
                lane(self.acc[0], 1),
                lane(self.acc[1], 0),
                lane(self.acc[1], 1),
            ],
            self.flagged(),
        )
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
impl Simd {
    /// The hash part of [`Lanes::stripe`] on a stripe already loaded as
    /// its two vectors `a` (bytes 0–15) and `b` (16–31), keys of stripe `k`.
    #[inline(always)]
    fn stripe_v(&mut self, a: core::arch::wasm32::v128, b: core::arch::wasm32::v128, k: usize) {
        use core::arch::wasm32::{
            i64x2_add, u64x2, u64x2_extmul_high_u32x4, u64x2_extmul_low_u32x4, v128_xor,
        };
        let key = &KEYS[k];
        let da = v128_xor(a, u64x2(key[0], key[1]));
        let db = v128_xor(b, u64x2(key[2], key[3]));
        // 32-bit lanes i of da and db multiplied: [0, 1] and [2, 3].
        let (pl, ph) = (
            u64x2_extmul_low_u32x4(da, db),
            u64x2_extmul_high_u32x4(da, db),
        );
        self.acc[0] = i64x2_add(self.acc[0], i64x2_add(pl, b));
        self.acc[1] = i64x2_add(self.acc[1], i64x2_add(ph, a));
    }
}

/// SSE2 lanes (the x86_64 baseline): `acc[0]` holds lanes 0 and 1, `acc[1]`
/// lanes 2 and 3.
#[cfg(target_arch = "x86_64")]
struct Simd {
    acc: [core::arch::x86_64::__m128i; 2],
    or: core::arch::x86_64::__m128i,
}

#[cfg(target_arch = "x86_64")]
impl Lanes for Simd {
    #[inline(always)]
    fn new() -> Self {
        use core::arch::x86_64::{_mm_set_epi64x, _mm_setzero_si128};
        // SAFETY: SSE2 is part of the x86_64 baseline (the intrinsics are
        // only `unsafe` for the target-feature rule).
        unsafe {
            Simd {
                acc: [
                    _mm_set_epi64x(INIT[1] as i64, INIT[0] as i64),
                    _mm_set_epi64x(INIT[3] as i64, INIT[2] as i64),
                ],
                or: _mm_setzero_si128(),
            }
        }
    }

    #[inline(always)]
    fn stripe<const PLAIN: bool>(&mut self, s: &[u8], k: usize) {
        use crate::bytescan::simd::matches;
        use core::arch::x86_64::{
            __m128i, _mm_add_epi64, _mm_loadu_si128, _mm_mul_epu32, _mm_or_si128, _mm_set_epi64x,
            _mm_shuffle_epi32, _mm_xor_si128,
        };
        let s = &s[..STRIPE];
        let key = &KEYS[k];
        // SAFETY: SSE2 (baseline); `s` holds 32 bytes (sliced above) and
        // `_mm_loadu_si128` needs no alignment.
        unsafe {
            let a = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            let b = _mm_loadu_si128(s.as_ptr().add(16).cast::<__m128i>());
            let da = _mm_xor_si128(a, _mm_set_epi64x(key[1] as i64, key[0] as i64));
            let db = _mm_xor_si128(b, _mm_set_epi64x(key[3] as i64, key[2] as i64));
            // `_mm_mul_epu32` multiplies 32-bit lanes 0 and 2: spread lanes
            // [0, 1] (then [2, 3]) there first, as wasm's extmul reads them.
            const LOW: i32 = 0b01_01_00_00;
            const HIGH: i32 = 0b11_11_10_10;
            let pl = _mm_mul_epu32(_mm_shuffle_epi32::<LOW>(da), _mm_shuffle_epi32::<LOW>(db));
            let ph = _mm_mul_epu32(_mm_shuffle_epi32::<HIGH>(da), _mm_shuffle_epi32::<HIGH>(db));
            self.acc[0] = _mm_add_epi64(self.acc[0], _mm_add_epi64(pl, b));
            self.acc[1] = _mm_add_epi64(self.acc[1], _mm_add_epi64(ph, a));
            self.or = _mm_or_si128(self.or, _mm_or_si128(a, b));
            if PLAIN {
                let special = _mm_or_si128(
                    matches(s, [b'"', b'\\'], 0x20),
                    matches(&s[16..], [b'"', b'\\'], 0x20),
                );
                self.or = _mm_or_si128(self.or, special);
            }
        }
    }

    #[inline(always)]
    fn flagged(&self) -> bool {
        // SAFETY: SSE2 (baseline), as above.
        unsafe { core::arch::x86_64::_mm_movemask_epi8(self.or) != 0 }
    }

    #[inline(always)]
    fn scramble(&mut self) {
        use core::arch::x86_64::{
            _mm_add_epi64, _mm_mul_epu32, _mm_set1_epi64x, _mm_slli_epi64, _mm_srli_epi64,
            _mm_xor_si128,
        };
        // SAFETY: SSE2 (baseline), as above.
        unsafe {
            let p = _mm_set1_epi64x(SCRAMBLE as i64);
            for a in &mut self.acc {
                let x = _mm_xor_si128(*a, _mm_srli_epi64::<47>(*a));
                // x · P mod 2^64 = lo32(x) · P + (hi32(x) · P) << 32.
                let lo = _mm_mul_epu32(x, p);
                let hi = _mm_mul_epu32(_mm_srli_epi64::<32>(x), p);
                *a = _mm_add_epi64(lo, _mm_slli_epi64::<32>(hi));
            }
        }
    }

    #[inline(always)]
    fn lanes(&self) -> ([u64; 4], bool) {
        use core::arch::x86_64::{__m128i, _mm_storeu_si128};
        let mut out = [0u64; 4];
        // SAFETY: SSE2 (baseline); `out` has room for two 16-byte stores.
        unsafe {
            _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), self.acc[0]);
            _mm_storeu_si128(out.as_mut_ptr().add(2).cast::<__m128i>(), self.acc[1]);
            (out, self.flagged())
        }
    }
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
        // Every length across three rounds, with the tail at every size.
        for n in 0..800 {
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
    fn ascii_blocks_hash_alike() {
        // `block_hash_ascii` is `block_hash` on ASCII input, `None` as soon as
        // one byte (anywhere: first, last, in the padded tail) is 0x80 or more.
        for n in [0usize, 1, 31, 32, 255, 256, 257, 700] {
            let ascii: Vec<u8> = bytes(n, 4).iter().map(|b| b & 0x7f).collect();
            assert_eq!(
                block_hash_ascii(&ascii),
                Some(block_hash(&ascii)),
                "len {n}"
            );
            for at in [0, n / 2, n.saturating_sub(1)]
                .into_iter()
                .filter(|_| n > 0)
            {
                let mut b = ascii.clone();
                b[at] = 0x80 | (at as u8 & 0x7f);
                assert_eq!(block_hash_ascii(&b), None, "len {n} at {at}");
            }
        }
    }

    #[test]
    fn plain_blocks_hash_alike() {
        // `block_hash_plain` is `block_hash` on plain text, `None` with any
        // byte 0x80 or above, `"`, `\\` or control, at any position (the
        // early exit at every stripe, the padded tail), on every build.
        let plain_byte = |b: u8| {
            let c = 0x20 + b % 0x5f;
            if c == b'"' || c == b'\\' {
                b'a'
            } else {
                c
            }
        };
        for n in [0usize, 1, 5, 31, 32, 33, 64, 255, 256, 257, 300, 600] {
            let plain: Vec<u8> = bytes(n, 7).into_iter().map(plain_byte).collect();
            assert_eq!(
                block_hash_plain(&plain),
                Some(block_hash(&plain)),
                "len {n}"
            );
            for at in 0..n {
                for bad in [b'"', b'\\', 0x00, 0x1f, 0x80, 0xff] {
                    let mut b = plain.clone();
                    b[at] = bad;
                    assert_eq!(block_hash_plain(&b), None, "len {n} at {at} {bad:#x}");
                }
            }
        }
        // Bytes that only look close to the class are plain.
        let near = b" !#[]^~\x7f".repeat(30);
        assert_eq!(block_hash_plain(&near), Some(block_hash(&near)));
    }

    #[test]
    fn the_round_path_is_the_plain_hash() {
        // `block_hash_plain_round` (the WebAssembly build's minima test and
        // register hash) against `block_hash_plain` on 256-byte blocks: the
        // same hash for plain text, and `None` for every byte value outside
        // the plain class at every position (every byte value inside it is
        // tried at every position too, so the class is exact).
        for seed in 0..40 {
            let plain: [u8; 256] = std::array::from_fn(|i| {
                let c = 0x20 + ((i as u64 * 31 + seed * 7) % 0x5f) as u8;
                if c == b'"' || c == b'\\' {
                    b'z'
                } else {
                    c
                }
            });
            let want = block_hash_plain(&plain);
            assert_eq!(want, Some(block_hash(&plain)));
            assert_eq!(block_hash_plain_round(&plain), want, "seed {seed}");
        }
        let base: [u8; 256] = std::array::from_fn(|i| b'a' + (i % 26) as u8);
        for at in 0..256 {
            for v in 0..=255u8 {
                let mut b = base;
                b[at] = v;
                let want = block_hash_plain(&b);
                let plain = (0x20..0x80).contains(&v) && v != b'"' && v != b'\\';
                assert_eq!(want.is_some(), plain, "{v:#x}");
                assert_eq!(block_hash_plain_round(&b), want, "at {at} byte {v:#x}");
            }
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
        // Two rounds swapped (the scramble between rounds tells them apart).
        let long = bytes(512, 2);
        let mut rounds = long[256..].to_vec();
        rounds.extend_from_slice(&long[..256]);
        assert_ne!(block_hash(&long), block_hash(&rounds));
        let mut lanes = base.clone();
        lanes[..8].copy_from_slice(&base[16..24]);
        lanes[16..24].copy_from_slice(&base[..8]);
        assert!(seen.insert(block_hash(&lanes)));
        // The same word where the key makes its product vanish still counts.
        let zero_lo = (KEYS[0][0] & 0xffff_ffff).to_le_bytes();
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
