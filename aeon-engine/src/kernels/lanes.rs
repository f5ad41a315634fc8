//! Plain Rust loops compiled for the widest vectors the CPU has: the element-wise steps of the
//! forward pass (activations, softmax, attention's dots) and the state-space scans.
//!
//! A loop written once in plain Rust runs as it is (`LaneIsa::Scalar`: SSE2 on x86_64, NEON
//! on aarch64, where NEON is the baseline) or inlined into a `#[target_feature]` function for
//! AVX2 or AVX-512, where the compiler vectorizes it wider. Every variant gives the plain
//! loop's bits: each lane does exactly the scalar sequence of IEEE operations (Rust never
//! fuses a multiply and an add, nor reorders a sum), so widening changes only how many lanes
//! run at once. `FAT_KERNELS` caps them as it caps the matrix kernels.
//!
//! What a caller passes to [`vectorized!`] is inlined into the wide function; the functions it
//! calls must be `#[inline(always)]` to be widened with it (`ops::exp`, `ops::tanh`, ...).

use std::sync::OnceLock;

/// Which compilation of the loops runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneIsa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The variant that goes with the process's matrix kernels (so `FAT_KERNELS=avx2` or
/// `scalar` caps these loops too), chosen once.
pub fn lane_isa() -> LaneIsa {
    static ISA: OnceLock<LaneIsa> = OnceLock::new();
    *ISA.get_or_init(|| match super::kernels().isa {
        // `Isa::Avx2` / `AvxVnni` / `Avx512` are only chosen where the CPU has them.
        #[cfg(target_arch = "x86_64")]
        super::Isa::Avx2 | super::Isa::AvxVnni => LaneIsa::Avx2,
        #[cfg(target_arch = "x86_64")]
        super::Isa::Avx512 => LaneIsa::Avx512,
        _ => LaneIsa::Scalar,
    })
}

/// Every variant this CPU runs, the plain one first (for tests comparing them).
pub fn lane_isas() -> Vec<LaneIsa> {
    #[allow(unused_mut)]
    let mut v = vec![LaneIsa::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            v.push(LaneIsa::Avx2);
        }
        if is_x86_feature_detected!("avx512f") {
            v.push(LaneIsa::Avx512);
        }
    }
    v
}

/// `vectorized!(expr)` evaluates `expr` compiled for [`lane_isa`]; `vectorized!(isa => expr)`
/// for `isa`, which must be one of [`lane_isas`].
///
/// A macro, not a function taking a closure: each ISA's arm gets a closure of its own, called
/// from one place only, which the compiler then always inlines into the wide function (one
/// closure called from three arms is left out of line when its body is large, and runs narrow).
macro_rules! vectorized {
    ($e:expr) => {
        $crate::kernels::lanes::vectorized!($crate::kernels::lanes::lane_isa() => $e)
    };
    ($isa:expr => $e:expr) => {
        match $isa {
            $crate::kernels::lanes::LaneIsa::Scalar => $e,
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::lanes::LaneIsa::Avx2 => $crate::kernels::lanes::avx2(|| $e),
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::lanes::LaneIsa::Avx512 => $crate::kernels::lanes::avx512(|| $e),
        }
    };
}
pub(crate) use vectorized;

/// Runs `f` compiled for AVX2 (the `LaneIsa::Avx2` arm of [`vectorized!`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn avx2<R>(f: impl FnOnce() -> R) -> R {
    assert!(
        is_x86_feature_detected!("avx2"),
        "lanes: no AVX2 on this CPU"
    );
    // SAFETY: the CPU has AVX2 (checked just above).
    unsafe { on_avx2(f) }
}

/// Runs `f` compiled for AVX-512 (the `LaneIsa::Avx512` arm of [`vectorized!`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn avx512<R>(f: impl FnOnce() -> R) -> R {
    assert!(
        is_x86_feature_detected!("avx512f"),
        "lanes: no AVX-512F on this CPU"
    );
    // SAFETY: the CPU has AVX-512F (checked just above).
    unsafe { on_avx512(f) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn on_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn on_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}
