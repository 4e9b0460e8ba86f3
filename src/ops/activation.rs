//! SiLU-and-mul (module `activation`): rows `[gate (d) | up (d)]` -> `bf16(bf16(silu(gate)) * up)`.

use half::bf16;

/// Reference for `silu_and_mul_bf16`: `input` is `rows x 2d`, the result `rows x d`.
pub fn silu_and_mul_reference(input: &[bf16], rows: usize, d: usize) -> Vec<bf16> {
    assert_eq!(input.len(), rows * 2 * d, "input must be rows x 2d");
    let mut out = Vec::with_capacity(rows * d);
    for row in input.chunks_exact(2 * d) {
        let (gate, up) = row.split_at(d);
        for (&g, &u) in gate.iter().zip(up) {
            let g = f64::from(g.to_f32());
            let act = bf16::from_f64(g / (1.0 + (-g).exp()));
            out.push(bf16::from_f32(act.to_f32() * u.to_f32()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_silu_at_known_points() {
        // silu(0) = 0, silu(large) ~ x, silu(-large) ~ 0; up scales the result.
        let input: Vec<bf16> = [0.0f32, 8.0, -8.0, 1.0, 2.0, 3.0, 0.5, 1.0].iter().map(|&x| bf16::from_f32(x)).collect();
        let out = silu_and_mul_reference(&input, 1, 4);
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let want = [0.0, silu(8.0) * 3.0, silu(-8.0) * 0.5, silu(1.0)];
        for (o, w) in out.iter().zip(want) {
            assert!((f64::from(o.to_f32()) - w).abs() <= w.abs() * 0.01 + 1e-6, "{o} vs {w}");
        }
    }
}
