//! The state-space scans' inner loops (`crate::ssm`): one state row over many channels, each
//! channel a lane doing exactly the scalar sequence of IEEE operations (multiplies and adds,
//! never fused: Rust does not contract them), so every variant gives the scalar's bits.
//!
//! Compiled per ISA by [`super::lanes`] (`ops::exp` included: its f64 polynomial and
//! exponent-bit arithmetic are plain lane-wise operations).

use super::lanes::{vectorized, LaneIsa};
use crate::ops::exp;

/// Mamba-1, state row `s` of one step over the channels: `h = h * exp(sp * a) + b * xdt`,
/// `y += h * c` (`sp = softplus(dt)`, `xdt = x * sp` per channel; `b`, `c` the row's B and C).
#[derive(Clone, Copy)]
pub struct Mamba1Row<'a> {
    pub a: &'a [f32],
    pub sp: &'a [f32],
    pub xdt: &'a [f32],
    pub b: f32,
    pub c: f32,
}

/// Runs [`Mamba1Row`] on `h` and `y` (all slices one length) with `isa`.
pub fn mamba1_row(isa: LaneIsa, r: Mamba1Row<'_>, h: &mut [f32], y: &mut [f32]) {
    vectorized!(isa => mamba1_body(r, h, y))
}

#[inline(always)]
fn mamba1_body(r: Mamba1Row<'_>, h: &mut [f32], y: &mut [f32]) {
    let n = h.len();
    let (a, sp, xdt, y) = (&r.a[..n], &r.sp[..n], &r.xdt[..n], &mut y[..n]);
    for i in 0..n {
        let st = h[i] * exp(sp[i] * a[i]) + r.b * xdt[i];
        h[i] = st;
        y[i] += st * r.c;
    }
}

/// Mamba-2, state row `s` of one head over its channels: `h = h * da + b * (x * sp)`,
/// `y += h * c` (`da = exp(sp * A)` and `sp` the head's).
pub fn mamba2_row(
    isa: LaneIsa,
    (da, sp, b, c): (f32, f32, f32, f32),
    x: &[f32],
    h: &mut [f32],
    y: &mut [f32],
) {
    vectorized!(isa => mamba2_body((da, sp, b, c), x, h, y))
}

#[inline(always)]
fn mamba2_body((da, sp, b, c): (f32, f32, f32, f32), x: &[f32], h: &mut [f32], y: &mut [f32]) {
    let n = h.len();
    let (x, y) = (&x[..n], &mut y[..n]);
    for i in 0..n {
        let st = h[i] * da + b * (x[i] * sp);
        h[i] = st;
        y[i] += st * c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded values in [-scale, scale).
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// Every variant gives the scalar loop's bits, over many steps (the state feeds back) and
    /// a length that is no multiple of any vector width.
    #[test]
    fn every_variant_gives_the_scalar_bits() {
        let n = 1000 + 13;
        let a: Vec<f32> = values(n, 1, 8.0).iter().map(|v| -v.abs() - 0.5).collect();
        let sp: Vec<f32> = values(n, 2, 0.1).iter().map(|v| v.abs()).collect();
        let xdt = values(n, 3, 1.0);
        let run = |isa: LaneIsa| {
            let (mut h, mut y) = (values(n, 4, 1.0), vec![0.0f32; n]);
            let mut h2 = h.clone();
            let mut y2 = vec![0.0f32; n];
            for step in 0..50 {
                let bc = values(2, 100 + step, 1.0);
                let r = Mamba1Row {
                    a: &a,
                    sp: &sp,
                    xdt: &xdt,
                    b: bc[0],
                    c: bc[1],
                };
                mamba1_row(isa, r, &mut h, &mut y);
                mamba2_row(isa, (0.97, 0.05, bc[0], bc[1]), &xdt, &mut h2, &mut y2);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (bits(&h), bits(&y), bits(&h2), bits(&y2))
        };
        let want = run(LaneIsa::Scalar);
        assert!(want.1.iter().any(|&b| b != 0));
        for isa in super::super::lanes::lane_isas() {
            assert!(run(isa) == want, "{isa:?} differs from the scalar loop");
        }
    }
}
