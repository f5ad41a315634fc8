//! The station over real HTTP: the Paris chain, split ranges, and refusals of bad input.

mod support;

use std::time::Duration;

use fat_station::client::StationClient;
use knot_format::LayerRange;
use support::*;

fn start(args: &[&str]) -> StationProc {
    spawn_station(&[args, &["--listen", "127.0.0.1:0"]].concat())
}

fn client(s: &StationProc) -> StationClient {
    StationClient::new(&s.url, Duration::from_secs(120))
}

#[test]
fn paris_through_the_station_and_split_ranges_are_bit_identical() {
    let Some(path) = model(QWEN) else { return };
    let st = start(&["--knot", path.to_str().expect("utf-8 path")]);
    let c = client(&st);
    let h = c.health().expect("health");
    assert_eq!(
        (h.arch.as_str(), h.layers.as_str(), h.hidden),
        ("qwen2", "0-24", 896)
    );

    // An /embed larger than a session may hold is refused before anything is allocated.
    match c.embed(&vec![1; 5000]) {
        Err(fat_station::client::ClientError::Refused(fat_station::wire::Refusal {
            status,
            code,
            ..
        })) => {
            assert_eq!((status, code.as_str()), (413, "context_full"))
        }
        other => panic!("expected 413 context_full, got {other:?}"),
    }
    let x = c.embed(&[785, 6722, 315, 9625, 374]).expect("embed");
    assert_eq!(x.residual.len(), 5 * 896);
    let full = c
        .forward(&x.residual, LayerRange::new(0, 24), None, false)
        .expect("forward 0-24");
    let logits = c.lm_head(&full.residual).expect("lm-head").residual;
    assert_eq!(argmax(&logits), 12095, "station argmax must be \" Paris\"");

    // X-Logit-Rows: the logits after each of the last rows, each bit-identical to an
    // /lm-head of that row alone (what verifying drafted tokens in one trip relies on).
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let rows = c.lm_head_rows(&full.residual, 5).expect("5 logit rows");
    let vocab = logits.len();
    assert_eq!(rows.residual.len(), 5 * vocab);
    assert_eq!(bits(&rows.residual[4 * vocab..]), bits(&logits));
    for i in [0, 3] {
        let one = c
            .lm_head(&full.residual[i * 896..(i + 1) * 896])
            .expect("one row")
            .residual;
        assert_eq!(
            bits(&rows.residual[i * vocab..(i + 1) * vocab]),
            bits(&one),
            "row {i}"
        );
    }
    for bad in [0, 6] {
        match c.lm_head_rows(&full.residual, bad) {
            Err(fat_station::client::ClientError::Refused(fat_station::wire::Refusal {
                status,
                code,
                ..
            })) => {
                assert_eq!((status, code.as_str()), (400, "bad_request"), "{bad} rows")
            }
            other => panic!("{bad} rows of 5: expected 400, got {other:?}"),
        }
    }

    let a = c
        .forward(&x.residual, LayerRange::new(0, 12), None, false)
        .expect("forward 0-12");
    let b = c
        .forward(&a.residual, LayerRange::new(12, 24), None, false)
        .expect("forward 12-24");
    assert_eq!(
        bits(&b.residual),
        bits(&full.residual),
        "0-12 then 12-24 must equal 0-24 bit for bit"
    );

    // Sessions: prefill 5 then decode " Paris" equals a stateless 6-token run.
    let p = c
        .forward(&x.residual, LayerRange::new(0, 24), Some(("t1", 0)), false)
        .expect("prefill");
    assert_eq!(bits(&p.residual), bits(&full.residual));
    let e = c.embed(&[12095]).expect("embed paris");
    let d = c
        .forward(&e.residual, LayerRange::new(0, 24), Some(("t1", 5)), false)
        .expect("decode");
    let six = c
        .embed(&[785, 6722, 315, 9625, 374, 12095])
        .expect("embed 6");
    let s6 = c
        .forward(&six.residual, LayerRange::new(0, 24), None, false)
        .expect("forward 6");
    assert_eq!(
        bits(&d.residual),
        bits(&s6.residual[5 * 896..]),
        "session decode must equal the stateless run"
    );
}

#[test]
fn station_refuses_bad_input_with_json_4xx() {
    let Some(path) = model(QWEN) else { return };
    let st = start(&[
        "--knot",
        path.to_str().expect("utf-8 path"),
        "--role",
        "mid",
        "--layers",
        "8..16",
    ]);
    let c = client(&st);
    let h = c.health().expect("health");
    assert_eq!((h.role.as_str(), h.layers.as_str()), ("mid", "8-16"));

    let refused = |r: Result<fat_station::client::Hop, fat_station::client::ClientError>| match r {
        Err(fat_station::client::ClientError::Refused(fat_station::wire::Refusal {
            status,
            code,
            message,
            ..
        })) => (status, code, message),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let (s, code, msg) = refused(c.embed(&[1, 2]));
    assert_eq!((s, code.as_str()), (404, "not_held"), "{msg}");
    let (s, code, msg) = refused(c.forward(&vec![0.0; 896], LayerRange::new(0, 8), None, false));
    assert_eq!((s, code.as_str()), (404, "not_held"));
    assert!(
        msg.contains("8-16"),
        "the refusal names the held range: {msg}"
    );
    let (s, code, _) = refused(c.forward(&vec![0.0; 895], LayerRange::new(8, 16), None, false));
    assert_eq!((s, code.as_str()), (400, "bad_residual"));
    let (s, code, _) = refused(c.lm_head(&vec![0.0; 896]));
    assert_eq!((s, code.as_str()), (404, "not_held"));
    let (s, code, _) = refused(c.forward(
        &vec![0.0; 896],
        LayerRange::new(8, 16),
        Some(("s", 3)),
        false,
    ));
    assert_eq!((s, code.as_str()), (409, "session_mismatch"));
    // Still serving after all that.
    c.forward(&vec![0.5; 896], LayerRange::new(8, 16), None, false)
        .expect("a good request still works");
}
