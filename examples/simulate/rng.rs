//! Deterministic pseudo-random numbers (SplitMix64) and the few distributions
//! the workloads need. No global state: every generator is seeded explicitly,
//! so a run is a pure function of its seed.

/// SplitMix64 finaliser: a good 64-bit mixer, used for text and ids too.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`; different streams of one run use different
    /// `seed`s (e.g. `mix64(seed ^ STREAM)`).
    pub fn new(seed: u64) -> Rng {
        Rng(mix64(seed))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
        }
    }

    /// Uniform integer in [lo, hi].
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below(u64::from(hi.saturating_sub(lo)) + 1) as u32
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.f64()).ln()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64();
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Log-normal with the given median and log-space sigma, clamped to [lo, hi].
    pub fn lognormal(&mut self, median: f64, sigma: f64, lo: u32, hi: u32) -> u32 {
        let v = median * (sigma * self.normal()).exp();
        (v.round() as i64).clamp(i64::from(lo), i64::from(hi)) as u32
    }
}

/// Zipf(α) sampler over ranks 0..n by inverse CDF (binary search).
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Popularity of rank k proportional to 1/(k+1)^alpha.
    pub fn new(n: usize, alpha: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 0..n {
            acc += 1.0 / ((k + 1) as f64).powf(alpha);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// A rank.
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.f64();
        self.cdf
            .partition_point(|&c| c < u)
            .min(self.cdf.len().saturating_sub(1))
    }

    /// Probability of the most popular rank.
    pub fn top_share(&self) -> f64 {
        self.cdf.first().copied().unwrap_or(0.0)
    }
}

/// `HashMap` keyed by pre-hashed u64s (the engine model's pass-through hasher).
pub use engine_model::IdMap;
