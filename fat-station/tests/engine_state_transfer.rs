//! A session's state shipped to another session (`Session::export_state` /
//! `import_state`, what `POST /checkpoint` carries): the receiver continues bit for bit as
//! the sender would, for every recurrent kind and a transformer, in one record or in two
//! (the second carrying only the new keys and values); records of another model, another
//! shape, or cut or altered bytes are refused and change nothing.

mod support;

use fat_station::engine::{Model, StateError};
use knot_format::Knot;

const PROMPT: [u32; 5] = [785, 6722, 315, 9625, 374];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Greedy continuation of `n` tokens after `next`, returning every step's logits.
fn decode(
    model: &Model,
    s: &mut fat_station::engine::Session,
    mut next: Vec<f32>,
    n: usize,
) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let t = support::argmax(&next) as u32;
        next = model.logits(s, &[t]).expect("decode");
        out.push(bits(&next));
    }
    out
}

#[test]
fn a_shipped_state_continues_bit_for_bit_and_in_two_records() {
    // One of each state kind: Gated DeltaNet + attention, short convolution + attention,
    // Mamba, and a transformer.
    for preset in ["qwen35-tiny", "lfm2-tiny", "mamba-tiny", "llama3-tiny"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((_, path)) = test_support::synthetic_model(dir.path(), preset, &[]) else {
            return;
        };
        let knot = Knot::open(&path).expect("open");
        let model = Model::load(&knot, None).expect("load");
        let cfg = &model.cfg;
        let mut a = model.new_session(64);
        let next = model.logits(&mut a, &PROMPT).expect("prefill");
        // Only LFM2's short convolutions take the short-convolution scratch (a Mamba session
        // used to get it too).
        assert_eq!(
            !a.scratch().bcx.is_empty(),
            preset == "lfm2-tiny",
            "{preset}: short-convolution scratch"
        );
        // The prompt's state, in one record.
        let rec = a.export_state(cfg, 0).expect("export");
        assert_eq!(
            rec.len(),
            a.state_record_bytes(cfg, 0, PROMPT.len()),
            "{preset}"
        );
        let mut b = model.new_session(64);
        assert_eq!(b.import_state(cfg, &rec).expect("import"), PROMPT.len());
        let want = decode(&model, &mut a, next.clone(), 3);
        assert_eq!(
            decode(&model, &mut b, next.clone(), 3),
            want,
            "{preset}: one record"
        );

        // Two records: the prompt's, then (a 3 steps on) only the new keys and values.
        let rec2 = a.export_state(cfg, PROMPT.len()).expect("export");
        let at = PROMPT.len() + 3;
        assert_eq!(
            rec2.len(),
            a.state_record_bytes(cfg, PROMPT.len(), at),
            "{preset}"
        );
        let mut c = model.new_session(64);
        c.import_state(cfg, &rec).expect("import");
        assert_eq!(
            c.import_state(cfg, &rec2).expect("increment"),
            at,
            "{preset}"
        );
        let last = model.logits(&mut a, &[7]).expect("a");
        let last_c = model.logits(&mut c, &[7]).expect("c");
        assert_eq!(bits(&last), bits(&last_c), "{preset}: two records");

        // A rewind to the shipped position is exact (it is a checkpoint now).
        let mut e = model.new_session(64);
        e.import_state(cfg, &rec).expect("import");
        let first = decode(&model, &mut e, next.clone(), 2);
        assert_eq!(
            e.truncate(PROMPT.len(), cfg.kv_dim()),
            PROMPT.len(),
            "{preset}"
        );
        assert_eq!(
            decode(&model, &mut e, next.clone(), 2),
            first,
            "{preset}: rewind"
        );

        // The keys and values start beyond what a fresh session holds: a gap, named.
        if !cfg.recurrent_layers.iter().all(|&r| r) {
            let mut f = model.new_session(64);
            match f.import_state(cfg, &rec2) {
                Err(StateError::Gap { from, held }) => assert_eq!((from, held), (5, 0)),
                other => panic!("{preset}: a gap must be refused, got {other:?}"),
            }
        }
    }
}

#[test]
fn records_of_another_model_or_cut_or_altered_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((_, qwen35)) = test_support::synthetic_model(dir.path(), "qwen35-tiny", &[]) else {
        return;
    };
    let Some((_, lfm2)) = test_support::synthetic_model(dir.path(), "lfm2-tiny", &[]) else {
        return;
    };
    let (kq, kl) = (
        Knot::open(&qwen35).expect("open"),
        Knot::open(&lfm2).expect("open"),
    );
    let (mq, ml) = (
        Model::load(&kq, None).expect("load"),
        Model::load(&kl, None).expect("load"),
    );
    let mut a = mq.new_session(64);
    let next = mq.logits(&mut a, &PROMPT).expect("prefill");
    let rec = a.export_state(&mq.cfg, 0).expect("export");
    let mut other = ml.new_session(64);
    ml.logits(&mut other, &PROMPT[..2]).expect("prefill");
    let bad = |s: &mut fat_station::engine::Session, cfg, r: &[u8], what: &str| match s
        .import_state(cfg, r)
    {
        Err(StateError::Bad(why)) => eprintln!("{what}: {why}"),
        other => panic!("{what}: must be refused, got {other:?}"),
    };
    // Another model's state.
    bad(&mut other, &ml.cfg, &rec, "qwen35 record into lfm2");
    assert_eq!(other.positions(0, ml.cfg.kv_dim()), Some(2), "unchanged");
    let mut b = mq.new_session(64);
    // Cut, lengthened, another magic, a kind byte changed, another layer range, a position
    // past the session's bound.
    bad(&mut b, &mq.cfg, &rec[..rec.len() - 4], "cut");
    let mut long = rec.clone();
    long.extend_from_slice(&[0; 4]);
    bad(&mut b, &mq.cfg, &long, "lengthened");
    let mut m = rec.clone();
    m[0] ^= 1;
    bad(&mut b, &mq.cfg, &m, "magic");
    let mut k = rec.clone();
    k[32] = 0; // the first layer (a DeltaNet) named attention
    bad(&mut b, &mq.cfg, &k, "kind");
    let mut r = rec.clone();
    r[12] = 3; // layers 0-3 of a 4-layer model
    bad(&mut b, &mq.cfg, &r, "range");
    let mut p = rec.clone();
    p[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    bad(&mut b, &mq.cfg, &p, "position past the bound");
    bad(&mut b, &mq.cfg, &[], "empty");
    assert_eq!(b.positions(0, mq.cfg.kv_dim()), Some(0), "nothing changed");
    // And the intact record still works.
    b.import_state(&mq.cfg, &rec).expect("import");
    let t = support::argmax(&next) as u32;
    assert_eq!(
        bits(&mq.logits(&mut b, &[t]).expect("b")),
        bits(&mq.logits(&mut a, &[t]).expect("a"))
    );
}
