//! Comparing bf16 results: distance in units in the last place (ulp), which is what bf16
//! rounding differences produce (an fp32 intermediate that lands on the other side of a
//! rounding boundary moves the result by one ulp).

use half::bf16;
use serde::Serialize;

/// Distance between two bf16 values in ulps, on the ordered integer line of bf16 bit patterns.
/// NaN against anything but the same NaN pattern is `u32::MAX`.
pub fn ulp_distance(a: bf16, b: bf16) -> u32 {
    if a.is_nan() || b.is_nan() {
        return if a.to_bits() == b.to_bits() {
            0
        } else {
            u32::MAX
        };
    }
    let ordered = |x: bf16| {
        let bits = x.to_bits() as i32;
        // Map sign-magnitude to a monotonic integer line; +0 and -0 both map to 0.
        if bits & 0x8000 != 0 {
            -(bits & 0x7fff)
        } else {
            bits
        }
    };
    ordered(a).abs_diff(ordered(b))
}

/// How far a result is from its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UlpReport {
    pub count: usize,
    /// Elements that differ at all.
    pub differing: usize,
    pub max_ulps: u32,
    /// Index of the first element at `max_ulps`.
    pub worst_index: usize,
}

impl UlpReport {
    pub fn bitwise_equal(&self) -> bool {
        self.differing == 0
    }
}

impl std::fmt::Display for UlpReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} differ, max {} ulp (at index {})",
            self.differing, self.count, self.max_ulps, self.worst_index
        )
    }
}

/// Compares element by element. Slices of different lengths compare as `max_ulps = u32::MAX`.
pub fn compare(got: &[bf16], want: &[bf16]) -> UlpReport {
    if got.len() != want.len() {
        return UlpReport {
            count: got.len().max(want.len()),
            differing: got.len().max(want.len()),
            max_ulps: u32::MAX,
            worst_index: 0,
        };
    }
    let mut report = UlpReport {
        count: got.len(),
        differing: 0,
        max_ulps: 0,
        worst_index: 0,
    };
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = ulp_distance(g, w);
        if d > 0 {
            report.differing += 1;
        }
        if d > report.max_ulps {
            report.max_ulps = d;
            report.worst_index = i;
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_ulps_across_zero_and_binades() {
        let one = bf16::from_f32(1.0);
        let next = bf16::from_bits(one.to_bits() + 1);
        assert_eq!(ulp_distance(one, one), 0);
        assert_eq!(ulp_distance(one, next), 1);
        assert_eq!(ulp_distance(bf16::from_f32(0.0), bf16::from_f32(-0.0)), 0);
        let tiny = bf16::from_bits(1);
        assert_eq!(ulp_distance(tiny, bf16::from_bits(0x8001)), 2);
        assert_eq!(ulp_distance(bf16::NAN, one), u32::MAX);
    }

    #[test]
    fn report_finds_the_worst_element() {
        let want: Vec<bf16> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        let mut got = want.clone();
        got[2] = bf16::from_bits(got[2].to_bits() + 3);
        got[3] = bf16::from_bits(got[3].to_bits() + 1);
        let r = compare(&got, &want);
        assert_eq!((r.differing, r.max_ulps, r.worst_index), (2, 3, 2));
        assert!(!r.bitwise_equal());
        assert!(compare(&want, &want).bitwise_equal());
        assert_eq!(compare(&want[..2], &want).max_ulps, u32::MAX);
    }
}
