//! Small numeric building blocks of the forward pass. All are deterministic: each output
//! depends only on its own inputs, in a fixed summation order.

use knot_format::RopeStyle;

/// `out = x / rms(x) * w`, one row. Sum of squares in f64: Qwen's early residuals reach ~1e3.
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * scale * wi;
    }
}

/// In-place RMSNorm of one row.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi = *xi * scale * wi;
    }
}

/// Rotates every head of `x` (`n_heads * head_dim`) by position `pos`.
///
/// NeoX pairs dimension `i` with `i + head_dim/2`; normal pairs `2i` with `2i+1`.
pub fn rope(x: &mut [f32], head_dim: usize, pos: usize, base: f32, style: RopeStyle) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let freq = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let (sin, cos) = (pos as f64 * freq).sin_cos();
            let (sin, cos) = (sin as f32, cos as f32);
            let (a, b) = match style {
                RopeStyle::Neox => (i, i + half),
                RopeStyle::Normal => (2 * i, 2 * i + 1),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up`, the SwiGLU activation.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Causal attention of one query head over `n_pos` cached positions.
///
/// `k`, `v`: (n_pos, kv_dim); this head reads kv head `kv_head`. `scores` is scratch of
/// at least `n_pos`. Writes the weighted sum of values into `out` (head_dim).
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    out: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_pos: usize,
    kv_dim: usize,
    kv_head: usize,
    scores: &mut [f32],
) {
    let hd = q.len();
    let scale = 1.0 / (hd as f32).sqrt();
    let off = kv_head * hd;
    for (p, s) in scores[..n_pos].iter_mut().enumerate() {
        let kr = &k[p * kv_dim + off..p * kv_dim + off + hd];
        *s = q.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale;
    }
    softmax(&mut scores[..n_pos]);
    out.fill(0.0);
    for (p, &w) in scores[..n_pos].iter().enumerate() {
        let vr = &v[p * kv_dim + off..p * kv_dim + off + hd];
        for (o, &vv) in out.iter_mut().zip(vr) {
            *o += w * vv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_styles_pair_different_dimensions() {
        let mut a: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let mut b = a.clone();
        rope(&mut a, 8, 3, 10000.0, RopeStyle::Neox);
        rope(&mut b, 8, 3, 10000.0, RopeStyle::Normal);
        assert_ne!(a, b);
        // Rotation keeps each pair's norm.
        let n = |x: f32, y: f32| (x * x + y * y).sqrt();
        assert!((n(a[0], a[4]) - n(1.0, 5.0)).abs() < 1e-5);
        assert!((n(b[0], b[1]) - n(1.0, 2.0)).abs() < 1e-5);
    }

    #[test]
    fn rope_at_position_zero_is_identity() {
        let mut a: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let orig = a.clone();
        rope(&mut a, 8, 0, 10000.0, RopeStyle::Neox);
        assert_eq!(a, orig);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1000.0, 999.0, -5.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[0] > x[1] && x[1] > x[2]);
    }

    #[test]
    fn rmsnorm_unit_weights_gives_unit_rms() {
        let x = vec![3.0f32, -4.0, 5.0, 0.0];
        let mut o = vec![0.0; 4];
        rmsnorm(&mut o, &x, &[1.0; 4], 0.0);
        let rms = (o.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }
}
