//! Finding the next byte that matters: the search under the JSON scanner
//! ([`crate::json`]: the next `"`, `\` or control byte) and the response
//! scanner ([`crate::usage`]: the next `"`, `\` or newline; the next `_`).
//!
//! [`find`] returns the index of the first byte equal to one of `needles` or
//! below `below` (`below = 0`: no class test). Sixteen bytes per step with
//! SIMD: WebAssembly `simd128` in the filter's build (`.cargo/config.toml`;
//! one `v128.load`, one compare per needle, `i8x16.bitmask`) and SSE2 on
//! x86_64 (always present there), the same algorithm, so the native
//! instruction counts of `scripts/cost.sh` follow the wasm build's work.
//! Elsewhere, and for the last < 16 bytes, SWAR on eight-byte words
//! ([`find_swar`]). Every variant gives the byte loop's answer (tested
//! against it, on wasm32 too).
//!
//! Cost: O(position of the hit), ~1 compare per needle per 16 bytes; no
//! allocation. The lowest set bit of the mask is the answer, so bytes after
//! the hit never matter.

/// Index of the first byte of `hay` equal to one of `needles` or (if `below`
/// is not 0) less than `below` (at most 0x80). Long runs go 64 bytes per
/// step: four 16-byte match vectors OR-ed and tested once (the exact
/// position is only worked out at the hit).
#[cfg(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
))]
#[inline]
pub fn find<const N: usize>(hay: &[u8], needles: [u8; N], below: u8) -> Option<usize> {
    find_steps::<N, false>(hay, needles, below)
}

/// [`find`]; with `NEAR`, the first 16 bytes tested alone first
/// ([`find_near`]). One function, so each variant's loop is compiled in
/// place (a wrapper around [`find`] made the 64-byte loop ~3 instructions a
/// step slower in wasm).
#[cfg(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
))]
#[inline(always)]
fn find_steps<const N: usize, const NEAR: bool>(
    hay: &[u8],
    needles: [u8; N],
    below: u8,
) -> Option<usize> {
    if NEAR {
        if let Some(c) = hay.get(..16) {
            let bits = simd::bits(simd::matches(c, needles, below));
            if bits != 0 {
                return Some(bits.trailing_zeros() as usize);
            }
        }
    }
    let mut i = 0;
    while let Some(c) = hay.get(i..i + 64) {
        let m = [
            simd::matches(&c[..16], needles, below),
            simd::matches(&c[16..32], needles, below),
            simd::matches(&c[32..48], needles, below),
            simd::matches(&c[48..64], needles, below),
        ];
        if simd::any(simd::or(simd::or(m[0], m[1]), simd::or(m[2], m[3]))) {
            let bits = m
                .iter()
                .rev()
                .fold(0u64, |acc, v| acc << 16 | u64::from(simd::bits(*v)));
            return Some(i + bits.trailing_zeros() as usize);
        }
        i += 64;
    }
    while let Some(c) = hay.get(i..i + 16) {
        let bits = simd::bits(simd::matches(c, needles, below));
        if bits != 0 {
            return Some(i + bits.trailing_zeros() as usize);
        }
        i += 16;
    }
    find_swar(hay.get(i..)?, needles, below).map(|p| i + p)
}

/// [`find`] for hits that are usually near: the first 16 bytes are tested
/// alone first (one vector instead of four and their fold), then the
/// 64-byte steps from the start. For the JSON scanner, where most keys and
/// short values end within 16 bytes (the response scanner's hits are
/// farther apart: it keeps [`find`]; with the test its `usage/sse200` cost
/// ~4 % more wasm instructions).
#[cfg(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
))]
#[inline]
pub fn find_near<const N: usize>(hay: &[u8], needles: [u8; N], below: u8) -> Option<usize> {
    find_steps::<N, true>(hay, needles, below)
}

/// [`find_near`] without SIMD: [`find`].
#[cfg(not(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
)))]
#[inline]
pub fn find_near<const N: usize>(hay: &[u8], needles: [u8; N], below: u8) -> Option<usize> {
    find(hay, needles, below)
}

/// The needle that [`find`]'s SIMD step tests together with the class
/// "below `below`": when `below` is a power of two and `n ⊕ below < below`,
/// `x ↦ x ⊕ (n ⊕ below)` maps `[0, below)` onto itself and `n` onto `below`,
/// so `(v ⊕ (n ⊕ below)) ≤ below` is "below `below`, or `n`" in one xor and
/// one compare instead of two compares and an or. For the JSON scanner's
/// class (`"`, `\`, below 0x20: `"` ⊕ 0x20 = 0x02) that is four vector
/// operations per 16 bytes instead of five. Constant-folded at every call.
#[inline(always)]
#[allow(dead_code)] // only the SIMD builds fold a needle
fn folded_needle<const N: usize>(needles: [u8; N], below: u8) -> Option<u8> {
    if !below.is_power_of_two() || below > 0x40 {
        return None;
    }
    needles.into_iter().find(|n| n ^ below < below)
}

/// Split `b` after at most `room` characters (bytes that are not UTF-8
/// continuation bytes `10xxxxxx`): `(bytes, characters)` taken, where
/// `bytes` runs up to the start of character `room + 1` (the continuation
/// bytes after the last character taken belong to it) or to the end of `b`.
/// Invalid UTF-8 is counted the same way (a stray continuation byte is part
/// of the character before it).
///
/// 64 bytes per step while they fit: one test of the OR of four 16-byte
/// vectors for the common all-ASCII case (64 characters), else a population
/// count of their continuation bytes; then 16-byte steps; the split itself
/// byte by byte. SIMD as in [`find`]; SWAR on eight-byte words elsewhere.
/// Cost: O(bytes taken), ~3 vector operations per 16 ASCII bytes.
#[inline]
pub fn split_chars(b: &[u8], room: usize) -> (usize, usize) {
    let (mut i, mut chars) = split_chars_wide(b, room);
    let rest = &b[i..];
    if rest.len() <= room - chars {
        // All of it fits (a character is at least a byte): count the rest's
        // characters eight bytes at a time, no split to find (the common
        // case: the last < 16 bytes of a piece).
        let mut words = rest.chunks_exact(8);
        let mut n = 0;
        for w in words.by_ref() {
            n += chars_in_word(word(w));
        }
        n += words
            .remainder()
            .iter()
            .filter(|&&c| c & 0xC0 != 0x80)
            .count();
        return (b.len(), chars + n);
    }
    for &c in rest {
        if c & 0xC0 != 0x80 {
            if chars == room {
                return (i, chars);
            }
            chars += 1;
        }
        i += 1;
    }
    (b.len(), chars)
}

/// The whole-vector part of [`split_chars`]: bytes and characters of the
/// longest prefix of 16-byte steps whose characters fit in `room`.
#[cfg(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
))]
#[inline(always)]
fn split_chars_wide(b: &[u8], room: usize) -> (usize, usize) {
    let (mut i, mut chars) = (0, 0);
    // Only while 64 more characters could fit: no vector is loaded twice.
    while room - chars >= 64 {
        let Some(c) = b.get(i..i + 64) else { break };
        let v = [
            simd::load(&c[..16]),
            simd::load(&c[16..32]),
            simd::load(&c[32..48]),
            simd::load(&c[48..64]),
        ];
        let n = if simd::high_bits(simd::or(simd::or(v[0], v[1]), simd::or(v[2], v[3]))) == 0 {
            64
        } else {
            64 - v
                .iter()
                .map(|v| simd::continuation_bits(*v).count_ones() as usize)
                .sum::<usize>()
        };
        if chars + n > room {
            break;
        }
        chars += n;
        i += 64;
    }
    while room - chars >= 16 {
        let Some(c) = b.get(i..i + 16) else { break };
        let n = 16 - simd::continuation_bits(simd::load(c)).count_ones() as usize;
        if chars + n > room {
            break;
        }
        chars += n;
        i += 16;
    }
    (i, chars)
}

/// The whole-word part of [`split_chars`] without SIMD (eight bytes a step).
#[cfg(not(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
)))]
#[inline(always)]
fn split_chars_wide(b: &[u8], room: usize) -> (usize, usize) {
    let (mut i, mut chars) = (0, 0);
    for c in b.chunks_exact(8) {
        let n = chars_in_word(word(c));
        if chars + n > room {
            break;
        }
        chars += n;
        i += 8;
    }
    (i, chars)
}

/// Characters (bytes that are not UTF-8 continuation bytes) in one
/// little-endian word: eight minus the continuation bytes, found as "bit 7
/// set and bit 6 clear" in every byte at once.
#[inline]
fn chars_in_word(w: u64) -> usize {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    if w & HIGH == 0 {
        return 8; // ASCII: the common case, no population count
    }
    8 - (w & !(w << 1) & HIGH).count_ones() as usize
}

/// The 16-byte steps of [`find`]: WebAssembly SIMD.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) mod simd {
    use core::arch::wasm32::{
        i8x16_lt, i8x16_splat, u8x16, u8x16_bitmask, u8x16_eq, u8x16_lt, u8x16_splat, v128,
        v128_any_true, v128_or, v128_xor,
    };

    /// Byte `i` all ones iff `c[i]` (`c` holds at least 16 bytes) matches.
    #[inline(always)]
    pub fn matches<const N: usize>(c: &[u8], needles: [u8; N], below: u8) -> v128 {
        let v = load(c);
        let folded = super::folded_needle(needles, below);
        let mut m = match folded {
            // [0, below) ∪ {n}: one xor and one compare (see `folded_needle`).
            Some(n) => u8x16_lt(v128_xor(v, u8x16_splat(n ^ below)), u8x16_splat(below + 1)),
            None => u8x16_lt(v, u8x16_splat(below)),
        };
        for n in needles {
            if Some(n) != folded {
                m = v128_or(m, u8x16_eq(v, u8x16_splat(n)));
            }
        }
        m
    }

    /// Sixteen bytes (`c` holds at least 16): sixteen consecutive byte
    /// loads, which LLVM emits as one `v128.load`.
    #[inline(always)]
    pub fn load(c: &[u8]) -> v128 {
        u8x16(
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13],
            c[14], c[15],
        )
    }

    /// Bit `i` set iff byte `i` of `v` is a UTF-8 continuation byte
    /// (0x80..=0xBF: below -64 as a signed byte).
    #[inline(always)]
    pub fn continuation_bits(v: v128) -> u32 {
        u32::from(u8x16_bitmask(i8x16_lt(v, i8x16_splat(-64))))
    }

    /// Bit `i` set iff byte `i` of `v` is 0x80 or above.
    #[inline(always)]
    pub fn high_bits(v: v128) -> u32 {
        u32::from(u8x16_bitmask(v))
    }

    #[inline(always)]
    pub fn or(a: v128, b: v128) -> v128 {
        v128_or(a, b)
    }

    #[inline(always)]
    pub fn any(m: v128) -> bool {
        v128_any_true(m)
    }

    /// Bit `i` set iff byte `i` of `m` is set.
    #[inline(always)]
    pub fn bits(m: v128) -> u32 {
        u32::from(u8x16_bitmask(m))
    }
}

/// The 16-byte steps of [`find`]: SSE2 (part of the x86_64 baseline).
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd {
    use core::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8,
        _mm_or_si128, _mm_set1_epi8, _mm_setzero_si128, _mm_xor_si128,
    };

    /// Byte `i` all ones iff `c[i]` (`c` holds at least 16 bytes) matches.
    #[inline(always)]
    pub fn matches<const N: usize>(c: &[u8], needles: [u8; N], below: u8) -> __m128i {
        let v = load(c);
        let folded = super::folded_needle(needles, below);
        // x < b + 1 (unsigned) ⇔ min(x, b) == x.
        let le = |x: __m128i, b: u8| -> __m128i {
            // SAFETY: SSE2, as below.
            unsafe { _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(b as i8)), x) }
        };
        // SAFETY: SSE2 is part of the x86_64 baseline (the intrinsics are
        // only `unsafe` for the target-feature rule).
        unsafe {
            let mut m = match folded {
                // [0, below) ∪ {n}: one xor and one compare (see `folded_needle`).
                Some(n) => le(_mm_xor_si128(v, _mm_set1_epi8((n ^ below) as i8)), below),
                None if below == 0 => _mm_setzero_si128(),
                None => le(v, below - 1),
            };
            for n in needles {
                if Some(n) != folded {
                    m = _mm_or_si128(m, _mm_cmpeq_epi8(v, _mm_set1_epi8(n as i8)));
                }
            }
            m
        }
    }

    /// Sixteen bytes (`c` holds at least 16: asserted).
    #[inline(always)]
    pub fn load(c: &[u8]) -> __m128i {
        assert!(c.len() >= 16);
        // SAFETY: SSE2 (baseline); `c` holds at least 16 bytes (asserted)
        // and `_mm_loadu_si128` needs no alignment.
        unsafe { _mm_loadu_si128(c.as_ptr().cast::<__m128i>()) }
    }

    /// Bit `i` set iff byte `i` of `v` is a UTF-8 continuation byte
    /// (0x80..=0xBF: below -64 as a signed byte).
    #[inline(always)]
    pub fn continuation_bits(v: __m128i) -> u32 {
        // SAFETY: SSE2, as above.
        unsafe { _mm_movemask_epi8(_mm_cmplt_epi8(v, _mm_set1_epi8(-64))) as u32 }
    }

    /// Bit `i` set iff byte `i` of `v` is 0x80 or above.
    #[inline(always)]
    pub fn high_bits(v: __m128i) -> u32 {
        bits(v)
    }

    #[inline(always)]
    pub fn or(a: __m128i, b: __m128i) -> __m128i {
        // SAFETY: SSE2, as above.
        unsafe { _mm_or_si128(a, b) }
    }

    #[inline(always)]
    pub fn any(m: __m128i) -> bool {
        bits(m) != 0
    }

    /// Bit `i` set iff byte `i` of `m` has its high bit set.
    #[inline(always)]
    pub fn bits(m: __m128i) -> u32 {
        // SAFETY: SSE2, as above.
        unsafe { _mm_movemask_epi8(m) as u32 }
    }
}

/// [`find`] without SIMD: [`find_swar`].
#[cfg(not(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
)))]
#[inline]
pub fn find<const N: usize>(hay: &[u8], needles: [u8; N], below: u8) -> Option<usize> {
    find_swar(hay, needles, below)
}

fn word(c: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&c[..8]);
    u64::from_le_bytes(w)
}

/// High bit of each byte of `w` set where it matches; exact for the lowest
/// set byte (`(v - 0x01…) & !v & 0x80…` flags zero bytes of `v`, and can
/// only flag a false one above a true one; `(w - b…) & !w & 0x80…` flags
/// bytes below `b` the same way, for `b ≤ 0x80`).
#[inline(always)]
fn word_flags<const N: usize>(w: u64, needles: [u8; N], below: u8) -> u64 {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut hit = if below == 0 {
        0
    } else {
        w.wrapping_sub(LO * u64::from(below)) & !w & HI
    };
    for n in needles {
        let x = w ^ (LO * u64::from(n));
        hit |= x.wrapping_sub(LO) & !x & HI;
    }
    hit
}

/// [`find`] eight bytes per step without SIMD (and for the tail). `below`
/// must be at most 0x80.
#[inline]
pub fn find_swar<const N: usize>(hay: &[u8], needles: [u8; N], below: u8) -> Option<usize> {
    debug_assert!(below <= 0x80);
    let mut chunks = hay.chunks_exact(8);
    let mut base = 0;
    for c in chunks.by_ref() {
        let hit = word_flags(word(c), needles, below);
        if hit != 0 {
            return Some(base + (hit.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|b| *b < below || needles.contains(b))
        .map(|p| base + p)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Every probe byte at every position of haystacks of 0..70 bytes (the
    /// SIMD part, the SWAR part and the tail), alone and before a second
    /// hit: `find`, `find_near` and `find_swar` agree with a byte loop.
    fn agrees<const N: usize>(needles: [u8; N], below: u8) {
        let naive = |b: &[u8]| b.iter().position(|c| *c < below || needles.contains(c));
        let probes = [
            0x00u8, 0x0a, 0x1f, 0x20, 0x21, b'"', 0x23, 0x3f, 0x40, 0x5b, b'\\', 0x5d, b'_', 0x60,
            0x7f, 0x80, 0xff,
        ];
        for len in 0..70usize {
            let base: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            assert_eq!(find(&base, needles, below), None, "len {len}");
            for pos in 0..len {
                for &p in &probes {
                    let mut v = base.clone();
                    v[pos] = p;
                    for second in [None, Some(pos + 3)] {
                        if let Some(s) = second.filter(|s| *s < len) {
                            v[s] = needles.first().copied().unwrap_or(0);
                        }
                        let want = naive(&v);
                        assert_eq!(find(&v, needles, below), want, "len {len} pos {pos} {p:#x}");
                        assert_eq!(
                            find_near(&v, needles, below),
                            want,
                            "near {len} {pos} {p:#x}"
                        );
                        assert_eq!(
                            find_swar(&v, needles, below),
                            want,
                            "swar {len} {pos} {p:#x}"
                        );
                    }
                }
            }
        }
    }

    /// `split_chars` against a byte loop: text mixing ASCII, two-, three-
    /// and four-byte characters and stray continuation bytes, split at every
    /// room, from every start (so vector steps meet characters at every
    /// offset); the SWAR word count against a byte count.
    #[test]
    fn split_chars_agrees_with_a_byte_loop() {
        let naive = |b: &[u8], room: usize| {
            let mut chars = 0;
            for (i, &c) in b.iter().enumerate() {
                if c & 0xC0 != 0x80 {
                    if chars == room {
                        return (i, chars);
                    }
                    chars += 1;
                }
            }
            (b.len(), chars)
        };
        let mut text = "plain ascii words, ".repeat(5).into_bytes();
        text.extend_from_slice("é漢🦊a".repeat(12).as_bytes());
        text.extend_from_slice(&[0x80, b'x', 0xbf, 0xbf, b'y']);
        text.extend_from_slice(&[b'z'; 70]);
        text.extend_from_slice("ü".repeat(40).as_bytes());
        for start in 0..20 {
            let b = &text[start..];
            for room in 0..b.len() + 2 {
                assert_eq!(
                    split_chars(b, room),
                    naive(b, room),
                    "start {start} room {room}"
                );
            }
        }
        for w in [0u64, u64::MAX, 0x80bf_c0ff_7f41_e282, 0x4141_4141_4141_4141] {
            let n = w
                .to_le_bytes()
                .iter()
                .filter(|&&c| c & 0xC0 != 0x80)
                .count();
            assert_eq!(chars_in_word(w), n, "{w:#x}");
        }
    }

    #[test]
    fn folded_needle_only_when_exact() {
        assert_eq!(folded_needle([b'"', b'\\'], 0x20), Some(b'"'));
        assert_eq!(folded_needle([b'"', b'\\', b'\n'], 0), None);
        assert_eq!(folded_needle([b'_'], 0), None);
        // 0x30 is not a power of two: no folding.
        assert_eq!(folded_needle([b'"'], 0x30), None);
    }

    #[test]
    fn json_specials() {
        agrees([b'"', b'\\'], 0x20);
        // Another folded class: [0, 0x40) ∪ {`}.
        agrees([b'`'], 0x40);
    }

    #[test]
    fn usage_needles() {
        agrees([b'"', b'\\', b'\n'], 0);
        agrees([b'_'], 0);
    }
}
