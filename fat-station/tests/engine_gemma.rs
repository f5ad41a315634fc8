//! Gemma-3-270M (gemma3: sandwich norms, GeGLU, q/k norms, 5 local : 1 global layers) against
//! llama.cpp on the same GGUF, and the determinism properties every architecture keeps.
//!
//! Golden files in tests/golden/gemma: llama.cpp on the same GGUF
//! (scripts/reference/make-gemma-llamacpp-golden.py, weight repacking off: that path crashes
//! here) and a NumPy f32 forward (scripts/reference/make-golden.sh).

mod support;

use fat_station::engine::{Model, Session};
use knot_format::{Knot, LayerRange};
use support::*;

fn session(m: &Model<'_>) -> Session {
    m.new_session(1024)
}

fn golden(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/gemma")
        .join(name)
}

#[test]
fn gemma_paris_logits_match_the_numpy_reference_and_llamacpp() {
    let Some(path) = model(GEMMA) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let logits = m
        .logits(&mut session(&m), &[2, 818, 5279, 529, 7001, 563])
        .expect("forward");
    assert_eq!(logits.len(), 262144);
    // NumPy f32 over gguf's dequantizers (scripts/reference/make-golden.sh) and llama.cpp on
    // the same GGUF (scripts/reference/make-gemma-llamacpp-golden.py); both quantize nothing /
    // their own way, so each is a bound, and llama.cpp's own distance to NumPy is the yardstick.
    let numpy = read_f32(&golden("gemma_paris_numpy.f32"));
    let peer = read_f32(&golden("gemma_paris_llamacpp.f32"));
    let (rms, max) = rms_max(&logits, &numpy);
    let (peer_rms, peer_max) = rms_max(&peer, &numpy);
    let (to_peer, to_peer_max) = rms_max(&logits, &peer);
    eprintln!(
        "paris: top-5 ours {:?} numpy {:?} llama.cpp {:?}; ' Paris' ours {:.3} numpy {:.3} llama.cpp {:.3}; \
         vs numpy: ours rms {rms:.4} max {max:.3}, llama.cpp rms {peer_rms:.4} max {peer_max:.3}; \
         ours vs llama.cpp rms {to_peer:.4} max {to_peer_max:.3}",
        top_ids(&logits, 5),
        top_ids(&numpy, 5),
        top_ids(&peer, 5),
        logits[9079],
        numpy[9079],
        peer[9079],
    );
    // ' Paris' and ' one' sit 0.004 apart in ours (0.16 in NumPy): the order of 3rd and 4th is
    // within quantization noise, the set of the top five is not.
    let set = |x: &[f32]| {
        let mut v = top_ids(x, 5);
        v.sort();
        v
    };
    assert_eq!(top_ids(&logits, 2), top_ids(&numpy, 2), "top-2 vs NumPy");
    assert_eq!(top_ids(&logits, 2), top_ids(&peer, 2), "top-2 vs llama.cpp");
    assert_eq!(set(&logits), set(&numpy), "top-5 ids vs NumPy");
    assert_eq!(set(&logits), set(&peer), "top-5 ids vs llama.cpp");
    assert!(
        rms <= 1.5 * peer_rms,
        "ours is {rms:.4} rms from the f32 reference, llama.cpp {peer_rms:.4}"
    );
}

/// Logits for `tokens` fed in chunks of the given sizes through one session, each chunk
/// through the blocks in the given split (e.g. `[0, 7, 18]`: blocks 0..7, then 7..18).
fn chunked(m: &Model<'_>, tokens: &[u32], chunks: &[usize], split: &[u32]) -> Vec<f32> {
    let mut s = session(m);
    let mut at = 0;
    let mut logits = Vec::new();
    for &c in chunks {
        let mut x = m.embed(&tokens[at..at + c]).expect("embed");
        for w in split.windows(2) {
            m.forward(&mut s, &mut x, LayerRange::new(w[0], w[1]))
                .expect("forward");
        }
        logits = m.lm_head(&x).expect("head");
        at += c;
    }
    assert_eq!(at, tokens.len());
    logits
}

#[test]
fn gemma_logits_are_bit_identical_across_threads_chunking_and_split_points() {
    let Some(path) = model(GEMMA) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    // "<bos>The capital of France is Paris. The capital" in Gemma's ids.
    let tokens = [2, 818, 5279, 529, 7001, 563, 9079, 236761, 669, 5279];
    let n = tokens.len();
    let whole = [0, 18];
    let batched = with_threads(2, || chunked(&m, &tokens, &[n], &whole));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let runs: [(&str, Vec<f32>); 5] = [
        (
            "1 thread",
            with_threads(1, || chunked(&m, &tokens, &[n], &whole)),
        ),
        (
            "token by token",
            with_threads(2, || chunked(&m, &tokens, &[1; 10], &whole)),
        ),
        (
            "5 + 5 through the KV cache",
            with_threads(2, || chunked(&m, &tokens, &[5, 5], &whole)),
        ),
        // A split inside the first local run and one right after the first global layer (5).
        (
            "split at 3 and 6",
            with_threads(2, || chunked(&m, &tokens, &[n], &[0, 3, 6, 18])),
        ),
        (
            "split at 12, token by token",
            with_threads(2, || chunked(&m, &tokens, &[1; 10], &[0, 12, 18])),
        ),
    ];
    for (what, logits) in runs {
        assert_eq!(bits(&batched), bits(&logits), "batched vs {what} differ");
    }
}

#[test]
fn gemma_local_layers_forget_positions_outside_the_window() {
    let Some(path) = model(GEMMA) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let w = m.cfg.sliding_window.expect("gemma3 has a sliding window");
    assert_eq!(w, 512);
    // Block 0 is local: the last row of w + 1 positions cannot see position 0, so changing
    // token 0 leaves that row unchanged. (Through two local blocks it would change: the
    // other rows carry position 0 forward.) Block 5 alone is global and must see it.
    let mut tokens: Vec<u32> = (0..w as u32 + 1).map(|i| 1000 + (i * 37) % 5000).collect();
    let last_row = |tokens: &[u32], layers: LayerRange| {
        let mut s = session(&m);
        let mut x = m.embed(tokens).expect("embed");
        m.forward(&mut s, &mut x, layers).expect("forward");
        x[x.len() - m.cfg.hidden..].to_vec()
    };
    let local = LayerRange::new(0, 1);
    let with_global = LayerRange::new(5, 6);
    let (a_local, a_global) = (last_row(&tokens, local), last_row(&tokens, with_global));
    tokens[0] = 2;
    let (b_local, b_global) = (last_row(&tokens, local), last_row(&tokens, with_global));
    assert_eq!(
        a_local, b_local,
        "a local layer saw a position outside its window"
    );
    assert_ne!(a_global, b_global, "the global layer must see position 0");
    // One position later, token 1 is the oldest one outside the window of the last row.
    tokens.push(1234);
    let c = last_row(&tokens, local);
    tokens[1] = 77;
    assert_eq!(c, last_row(&tokens, local));
}

/// Issue 19's bar on eleven prompts, against llama.cpp on the same GGUF
/// (tests/golden/gemma/llamacpp.json, scripts/reference/make-gemma-llamacpp-golden.py) and the
/// NumPy f32 forward (numpy.json: `ref_forward.py --cases`, the logits at llama.cpp's top-256
/// ids). The yardstick is llama.cpp's own distance from the f32 reference on each prompt
/// (its batched-vs-token-by-token difference, the first idea, is exactly 0 on four of
/// the short prompts, where both of its paths quantize the activations alike):
/// - rms over those 256 ids, all prompts pooled: ours from f32 within 1.5x llama.cpp's from
///   f32 (measured: 0.18 against 0.24); each prompt within 2x (one prompt, "Les pommes sont",
///   reads 1.73x: ours 0.32, llama.cpp 0.19; on nine of the eleven ours is the closer);
/// - top-5 ids as a set equal to the f32 reference's, an id at the edge excused only when the
///   reference puts it within 3x that yardstick of the 5th;
/// - greedy 16 tokens equal to llama.cpp's up to a step where its best two are closer than 3x
///   our rms distance to it (a near-tie two quantizations may order either way).
#[test]
fn gemma_agrees_with_llamacpp_and_the_f32_reference_on_eleven_prompts() {
    let Some(path) = model(GEMMA) else { return };
    let read_json = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(golden(name)).expect("golden file"))
            .expect("golden JSON")
    };
    let (peer, truth) = (read_json("llamacpp.json"), read_json("numpy.json"));
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let ints = |v: &serde_json::Value| -> Vec<u32> {
        let a = v.as_array().expect("array");
        a.iter().map(|x| x.as_u64().expect("int") as u32).collect()
    };
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        let a = v.as_array().expect("array");
        a.iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect()
    };
    let (cases, refs) = (
        peer["cases"].as_array().expect("cases"),
        truth["cases"].as_array().expect("cases"),
    );
    assert!(cases.len() >= 11 && refs.len() == cases.len());
    let mut failures = Vec::new();
    let (mut pooled, mut peer_pooled) = (0.0f64, 0.0f64);
    for (c, r) in cases.iter().zip(refs) {
        let text = c["text"].as_str().expect("text");
        let ids = ints(&c["ids"]);
        assert_eq!(ids, ints(&r["ids"]), "golden files out of step");
        let top = ints(&c["top_ids"]);
        let (theirs, exact) = (floats(&c["top_batched"]), floats(&r["at_top_ids"]));
        let logits = m.logits(&mut session(&m), &ids).expect("forward");
        let ours: Vec<f32> = top.iter().map(|&i| logits[i as usize]).collect();
        let (rms, _) = rms_max(&ours, &exact);
        let (peer_rms, _) = rms_max(&theirs, &exact);
        let (to_peer, _) = rms_max(&ours, &theirs);
        // Top-5 against the reference's own top 5 (which lie inside llama.cpp's top 256).
        let ref5 = ints(&r["top5"]);
        let ours5: Vec<u32> = top_ids(&logits, 5).iter().map(|&i| i as u32).collect();
        let exact_of = |id: u32| top.iter().position(|&t| t == id).map(|k| exact[k]);
        let fifth = exact_of(ref5[4]).expect("reference top-5 inside llama.cpp's top-256");
        let odd: Vec<u32> = ours5
            .iter()
            .filter(|id| !ref5.contains(id))
            .chain(ref5.iter().filter(|id| !ours5.contains(id)))
            .copied()
            .collect();
        let edge_ok = odd
            .iter()
            .all(|&id| exact_of(id).is_some_and(|v| ((v - fifth).abs() as f64) <= 3.0 * peer_rms));
        // Greedy against llama.cpp.
        let (want, gaps) = (ints(&c["greedy"]), floats(&c["greedy_gaps"]));
        let mut s = session(&m);
        let mut l = m.logits(&mut s, &ids).expect("forward");
        let mut diverged = None;
        for (k, &w) in want.iter().enumerate() {
            let got = argmax(&l) as u32;
            if got != w {
                diverged = Some((k, got, w, gaps[k]));
                break;
            }
            l = m.logits(&mut s, &[got]).expect("decode");
        }
        eprintln!(
            "{text:?}: rms from f32: ours {rms:.3} llama.cpp {peer_rms:.3} ({:.2}x); ours-llama.cpp {to_peer:.3}; \
             top-5 ours {ours5:?} f32 {ref5:?} llama.cpp {:?}; greedy {}",
            rms / peer_rms,
            &top[..5],
            match diverged {
                None => "16/16 equal".to_string(),
                Some((k, got, w, gap)) =>
                    format!("equal to step {k}, then ours {got} llama.cpp {w} (its gap {gap:.3})"),
            }
        );
        pooled += rms * rms;
        peer_pooled += peer_rms * peer_rms;
        if rms > 2.0 * peer_rms {
            failures.push(format!(
                "{text:?}: {rms:.3} from f32 > 2 x llama.cpp's {peer_rms:.3}"
            ));
        }
        if !edge_ok {
            failures.push(format!("{text:?}: top-5 {ours5:?} vs f32 {ref5:?}"));
        }
        if let Some((k, _, _, gap)) = diverged {
            if gap as f64 > 3.0 * to_peer {
                failures.push(format!(
                    "{text:?}: greedy differs at {k} where llama.cpp's gap is {gap:.3}"
                ));
            }
        }
    }
    let n = cases.len() as f64;
    let (pooled, peer_pooled) = ((pooled / n).sqrt(), (peer_pooled / n).sqrt());
    eprintln!("pooled rms from f32: ours {pooled:.3}, llama.cpp {peer_pooled:.3}");
    if pooled > 1.5 * peer_pooled {
        failures.push(format!(
            "pooled: {pooled:.3} from f32 > 1.5 x llama.cpp's {peer_pooled:.3}"
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
