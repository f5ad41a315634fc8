//! One grant format, one verifier (issue 17.6): the station refuses what `monster-guard
//! verify` refuses (an uppercase-hex signature, a file without its trailing newline, a
//! re-spaced file), and a revocation list older than one it has seen, or deleted after one was
//! seen, refuses every grant (issue 16.9). No model needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use aeon_grant::{GrantPayload, Revocation, RevocationList, SignedGrant};
use ed25519_dalek::SigningKey;
use fat_station::mesh::grant::{hex, GrantError, GrantVerifier};

fn mint(key: &SigningKey, name: &str) -> SignedGrant {
    let now = fat_station::mesh::grant::now_s();
    SignedGrant::sign(
        GrantPayload {
            v: 1,
            name: name.into(),
            caps: vec!["net".into()],
            issued: now,
            expires: now + 3600,
            issuer: hex(key.verifying_key().as_bytes()),
            model_path: "/m.knot".into(),
            model_hash: "ab".repeat(32),
            qspec_hash: "cd".repeat(32),
            probes: vec![],
            parent: None,
        },
        key,
        None,
    )
}

/// The variants of a canonical grant file that are not canonical.
fn non_canonical(g: &SignedGrant) -> Vec<(&'static str, Vec<u8>)> {
    let good = String::from_utf8(g.to_bytes()).unwrap();
    vec![
        (
            "uppercase-hex signature",
            good.replace(&g.sig, &g.sig.to_ascii_uppercase())
                .into_bytes(),
        ),
        (
            "no trailing newline",
            good.trim_end_matches('\n').as_bytes().to_vec(),
        ),
        ("re-spaced JSON", good.replacen(",", ", ", 1).into_bytes()),
        ("two trailing newlines", format!("{good}\n").into_bytes()),
    ]
}

/// `target/release/monster-guard` (or `$MONSTER_GUARD`), when built.
fn monster_guard() -> Option<PathBuf> {
    let p = std::env::var_os("MONSTER_GUARD")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/monster-guard")
        });
    p.exists().then_some(p)
}

#[test]
fn station_refuses_what_monster_guard_verify_refuses() {
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let v = GrantVerifier::from_arg(&hex(key.verifying_key().as_bytes())).unwrap();
    let now = fat_station::mesh::grant::now_s();
    let g = mint(&key, "qwen");
    assert!(v.verify(&g.to_bytes(), now).is_ok());
    assert!(v.verify_header(&hex(&g.to_bytes()), now).is_ok());
    let d = tempfile::tempdir().unwrap();
    let pubkey = d.path().join("issuer.pub");
    std::fs::write(
        &pubkey,
        format!("{}\n", hex(key.verifying_key().as_bytes())),
    )
    .unwrap();
    let mg = monster_guard();
    let mg_verify = |bytes: &[u8]| -> Option<bool> {
        let f = d.path().join("g.json");
        std::fs::write(&f, bytes).unwrap();
        let out = Command::new(mg.as_ref()?)
            .env("MONSTER_GUARD_HOME", d.path().join("home"))
            .arg("verify")
            .arg(&f)
            .arg("--pubkey")
            .arg(&pubkey)
            .output()
            .unwrap();
        Some(out.status.success())
    };
    if mg.is_none() {
        eprintln!("monster-guard not built: checking the station side only");
    }
    assert_ne!(
        mg_verify(&g.to_bytes()),
        Some(false),
        "monster-guard refused a canonical grant"
    );
    for (what, bytes) in non_canonical(&g) {
        let e = v.verify(&bytes, now).expect_err(what);
        assert!(
            matches!(e, GrantError::Malformed(_) | GrantError::Refused { .. }),
            "{what}: {e}"
        );
        assert!(v.verify_header(&hex(&bytes), now).is_err(), "{what}");
        assert_ne!(
            mg_verify(&bytes),
            Some(true),
            "monster-guard accepted {what}"
        );
    }
    // The header itself has one encoding too.
    assert!(v
        .verify_header(&hex(&g.to_bytes()).to_ascii_uppercase(), now)
        .is_err());
}

fn write_list(path: &Path, key: &SigningKey, seq: u64, revoked: &[&SignedGrant]) {
    let list = RevocationList {
        seq,
        entries: revoked
            .iter()
            .map(|g| Revocation {
                id: g.grant.id(),
                name: g.grant.name.clone(),
                at: 1,
            })
            .collect(),
        ..Default::default()
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, list.to_signed_bytes(key)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Issue 16.9 for `fat-station --revocations`: an old list put back or the list deleted.
#[test]
fn station_refuses_an_older_or_deleted_revocation_list() {
    let d = tempfile::tempdir().unwrap();
    let list = d.path().join("revoked.json");
    let state = d.path().join("state");
    let key = SigningKey::from_bytes(&[8u8; 32]);
    let (a, b) = (mint(&key, "a"), mint(&key, "b"));
    let now = fat_station::mesh::grant::now_s();
    write_list(&list, &key, 1, &[&a]);
    let old = std::fs::read(&list).unwrap();
    let v = GrantVerifier::new(key.verifying_key())
        .with_revocations(&list, &state)
        .unwrap();
    write_list(&list, &key, 2, &[&a, &b]);
    assert!(matches!(
        v.verify(&b.to_bytes(), now),
        Err(GrantError::Revoked { .. })
    ));
    // The old copy (which does not list b) put back: refused, every grant, fail closed.
    let tmp = list.with_extension("tmp");
    std::fs::write(&tmp, &old).unwrap();
    std::fs::rename(&tmp, &list).unwrap();
    let e = v.verify(&b.to_bytes(), now).unwrap_err();
    assert!(matches!(e, GrantError::Revocations { .. }), "{e}");
    assert!(
        e.to_string().contains("older than the newest seen (2)"),
        "{e}"
    );
    // A restarted station keeps what it saw (the watermark is in its state dir).
    assert!(GrantVerifier::new(key.verifying_key())
        .with_revocations(&list, &state)
        .is_err());
    // Deleted.
    std::fs::remove_file(&list).unwrap();
    let e = v.verify(&b.to_bytes(), now).unwrap_err();
    assert!(e.to_string().contains("is missing"), "{e}");
    let e = GrantVerifier::new(key.verifying_key())
        .with_revocations(&list, &state)
        .unwrap_err();
    assert!(e.to_string().contains("is missing"), "{e}");
    // A newer list brings the station back.
    write_list(&list, &key, 3, &[&a]);
    assert!(v.verify(&b.to_bytes(), now).is_ok());
}
