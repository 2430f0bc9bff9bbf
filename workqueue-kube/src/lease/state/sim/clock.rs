//! The simulation's clocks and randomness: real time in nanoseconds, and each replica's clock
//! at its own offset and rate.

use std::time::Duration;

use super::super::super::clock::LocalInstant;

/// A replica's clock: `offset + real * (1 + ppm / 1e6)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SimClock {
    pub(super) offset: u64,
    pub(super) ppm: i64,
}

const MILLION: i128 = 1_000_000;

impl SimClock {
    pub(super) fn local(&self, real: u64) -> LocalInstant {
        let scaled = i128::from(real) * (MILLION + i128::from(self.ppm)) / MILLION;
        LocalInstant::from_duration(Duration::from_nanos(self.offset + scaled as u64))
    }

    /// The first real instant at which this clock reads `local` or later.
    pub(super) fn real(&self, local: LocalInstant) -> u64 {
        let l = local.as_duration().as_nanos() as i128 - i128::from(self.offset);
        if l <= 0 {
            return 0;
        }
        let rate = MILLION + i128::from(self.ppm);
        let mut real = (l * MILLION + rate - 1) / rate;
        // Integer rounding: step to the first instant that reads `local`.
        while real > 0 && self.local(real as u64 - 1) >= local {
            real -= 1;
        }
        while self.local(real as u64) < local {
            real += 1;
        }
        u64::try_from(real).unwrap_or(u64::MAX)
    }
}

/// SplitMix64: small, fast and good enough to draw latencies.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(super) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `per_mille / 1000`.
    pub(super) fn chance(&mut self, per_mille: u32) -> bool {
        self.next() % 1000 < u64::from(per_mille)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_inverts_local() {
        for ppm in [-50_000, -7, 0, 3, 10_000] {
            let clock = SimClock {
                offset: 123_456_789,
                ppm,
            };
            for real in [0u64, 1, 999, 1_000_000_007, 90_000_000_000] {
                let local = clock.local(real);
                let back = clock.real(local);
                assert!(back <= real && clock.local(back) >= local, "{ppm} {real}");
                assert!(back == 0 || clock.local(back - 1) < local);
            }
        }
    }
}
