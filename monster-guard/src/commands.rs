//! The subcommands, as library functions writing their report to `out`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{GuardError, Result};
use crate::fsutil::{self, Home};
use crate::grant::{
    self, human_secs, short, Caps, GrantPayload, Revocation, SignedGrant, WatchedList,
};
use crate::identity::{self, hex};
use crate::lease;
use crate::qspec::{self, LoadedSpec};

fn w(out: &mut dyn Write, s: impl AsRef<str>) {
    // A closed stdout (broken pipe) must not turn a done job into an error.
    let _ = writeln!(out, "{}", s.as_ref());
}

/// `init`: creates the node identity.
pub fn init(home: &Home, force: bool, out: &mut dyn Write) -> Result<()> {
    let public = identity::init(home, force)?;
    w(
        out,
        format!(
            "node key written to {} (mode 0600)",
            home.key_path().display()
        ),
    );
    w(out, format!("public key {}", hex(public.as_bytes())));
    Ok(())
}

/// Options of `delegate`.
pub struct DelegateArgs<'a> {
    /// Grant name.
    pub name: &'a str,
    /// Capabilities to grant.
    pub caps: &'a Caps,
    /// Grant lifetime.
    pub ttl: Duration,
    /// The quality spec.
    pub qspec: &'a Path,
    /// Use this model file instead of the spec's `knot`.
    pub knot: Option<&'a Path>,
    /// Use this probe binary (the administrator's choice: trusted as given).
    pub probe: Option<&'a Path>,
}

/// `delegate`: runs the quality spec and, only if every probe passes, mints a signed grant.
pub fn delegate(home: &Home, a: &DelegateArgs<'_>, out: &mut dyn Write) -> Result<SignedGrant> {
    grant::check_name(a.name)?;
    // A fresh home gets its node key at the first delegation (no `init` needed); a key that
    // exists but is unusable (insecure mode, damaged) is still an error, before any probing.
    let key = match identity::load_signing(home) {
        Ok(k) => Some(k),
        Err(GuardError::NoKey(_)) => None,
        Err(e) => return Err(e),
    };
    let spec = LoadedSpec::load(a.qspec)?;
    let knot = match a.knot {
        Some(k) => k.to_path_buf(),
        None => spec.knot.clone(),
    };
    let knot = std::fs::canonicalize(&knot).map_err(|e| GuardError::io("open model", &knot, e))?;
    // The judge comes from the administrator, never from the spec (issue 32.1), and is
    // chosen before anything runs.
    let probe = qspec::resolve_probe(a.probe, &spec, &home.probes_dir())?;
    let before = fsutil::hash_file(&knot)?;
    // What the probe must say it judged: the file's KNOT model hash.
    let judged = qspec::knot_model_hash(&knot)?;
    w(
        out,
        format!("model {} blake3 {}", knot.display(), short(&before)),
    );
    w(
        out,
        format!(
            "running {} probe(s) from {} with {} ({})",
            spec.probes.len(),
            spec.path.display(),
            probe.path.display(),
            probe.origin
        ),
    );
    let mut results = Vec::new();
    for (name, p) in &spec.probes {
        let args = qspec::probe_args(&knot, &spec.spec, p);
        let output = qspec::run_probe(&probe.path, &args, name, spec.timeout())?;
        qspec::check_judged_model(name, &output, &judged)?;
        let s = qspec::judge(name, p, &output)?;
        w(out, format!("  {}", s.line()));
        results.push(s);
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|s| !s.pass)
        .map(|s| s.name.as_str())
        .collect();
    if !failed.is_empty() {
        return Err(GuardError::QualityFailed(format!(
            "{} of {} probes failed ({}); model {} refused, no grant minted",
            failed.len(),
            results.len(),
            failed.join(", "),
            knot.display()
        )));
    }
    // The model must not have been swapped while it was being probed.
    let after = fsutil::hash_file(&knot)?;
    if after != before {
        return Err(GuardError::QualityFailed(format!(
            "model file {} changed while it was probed",
            knot.display()
        )));
    }
    let key = match key {
        Some(k) => k,
        None => first_key(home)?,
    };
    let now = fsutil::now_secs();
    let payload = GrantPayload {
        v: 1,
        name: a.name.to_string(),
        caps: a.caps.to_vec(),
        issued: now,
        expires: now.saturating_add(a.ttl.as_secs().max(1)),
        issuer: hex(key.verifying_key().as_bytes()),
        model_path: knot.to_string_lossy().into_owned(),
        model_hash: before,
        qspec_hash: spec.hash.clone(),
        probes: results,
        parent: None,
    };
    let g = SignedGrant::sign(payload, &key, None);
    fsutil::private_dir(&home.grants_dir())?;
    let path = home.grant_path(a.name);
    grant::save(&g, &path)?;
    w(out, "quality spec passed -> delegated");
    w(
        out,
        format!(
            "grant {} ({}) caps {} expires in {}, written to {}",
            a.name,
            short(&g.grant.id()),
            a.caps,
            human_secs(g.grant.expires - now),
            path.display()
        ),
    );
    Ok(g)
}

/// Creates the node key of a fresh home (saying so on stderr) and returns it; if another
/// process created it meanwhile, that one is used.
fn first_key(home: &Home) -> Result<ed25519_dalek::SigningKey> {
    match identity::init(home, false) {
        Ok(public) => eprintln!(
            "monster-guard: no node key in {}: created {} (public key {})",
            home.dir.display(),
            home.key_path().display(),
            hex(public.as_bytes())
        ),
        Err(GuardError::KeyExists(_)) => {}
        Err(e) => return Err(e),
    }
    identity::load_signing(home)
}

/// Loads the grant for `run`/`verify`/`revoke`: an explicit file, or the stored grant of a name.
pub fn load_grant(home: &Home, name: Option<&str>, file: Option<&Path>) -> Result<SignedGrant> {
    match (name, file) {
        (_, Some(f)) => {
            let g = grant::load(f)?;
            if let Some(n) = name {
                if g.grant.name != n {
                    return Err(GuardError::GrantRefused(format!(
                        "{} is a grant for {:?}, not {n:?}",
                        f.display(),
                        g.grant.name
                    )));
                }
            }
            Ok(g)
        }
        (Some(n), None) => {
            grant::check_name(n)?;
            let p = home.grant_path(n);
            if !p.exists() {
                return Err(GuardError::GrantRefused(format!(
                    "no grant named {n:?} (looked for {})",
                    p.display()
                )));
            }
            grant::load(&p)
        }
        (None, None) => Err(GuardError::Invalid(
            "give --name NAME or --grant FILE".into(),
        )),
    }
}

/// Options of `run`.
pub struct RunArgs<'a> {
    /// Stored grant name.
    pub name: Option<&'a str>,
    /// Or a grant file (e.g. an attenuated one).
    pub grant: Option<&'a Path>,
    /// Capabilities requested for this run.
    pub caps: &'a Caps,
    /// Lease length.
    pub lease: Duration,
    /// Grace between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// How to contain the process tree.
    pub contain: crate::contain::Want,
    /// Run without the seccomp filter where none can be installed (`--allow-no-seccomp`).
    pub allow_no_seccomp: bool,
    /// The command.
    pub cmd: &'a [String],
}

/// `run`: checks the grant (signature chain, expiry, revocation, caps, model hash) and runs
/// the command under the lease. Returns the exit status (see the crate docs).
pub fn run(home: &Home, a: &RunArgs<'_>) -> Result<u8> {
    let issuer = identity::load_public(&home.pub_path())?;
    let g = load_grant(home, a.name, a.grant)?;
    let now = fsutil::now_secs();
    let revocations = WatchedList::open(
        &home.revoked_path(),
        issuer,
        Some(grant::watermark(home, &issuer)),
    )?;
    g.verify(&issuer, now, &*revocations.current()?)?;
    let missing = a.caps.missing_from(&g.grant.caps());
    if !missing.is_empty() {
        return Err(GuardError::GrantRefused(format!(
            "grant {:?} does not cover {} (it grants {})",
            g.grant.name,
            missing.join(","),
            g.grant.caps()
        )));
    }
    check_model(&g.grant)?;
    lease::run(
        &lease::LeaseRequest {
            grant: &g,
            caps: a.caps,
            lease: a.lease,
            grace: a.grace,
            cmd: a.cmd,
            revocations: &revocations,
            contain: a.contain,
            home,
            allow_no_seccomp: a.allow_no_seccomp,
        },
        now,
    )
}

/// Re-hashes the grant's model file and compares it with the admitted hash.
pub fn check_model(g: &GrantPayload) -> Result<()> {
    let path = PathBuf::from(&g.model_path);
    let now = match fsutil::hash_file(&path) {
        Ok(h) => h,
        Err(e) => {
            return Err(GuardError::GrantRefused(format!(
                "model file of grant {:?} unreadable: {}",
                g.name,
                e.full()
            )))
        }
    };
    if now != g.model_hash {
        return Err(GuardError::GrantRefused(format!(
            "model file {} changed since admission (blake3 {} now, {} admitted); run delegate again",
            path.display(),
            short(&now),
            short(&g.model_hash)
        )));
    }
    Ok(())
}

/// `revoke`: adds the stored grant of `name` to the signed revocation list.
pub fn revoke(home: &Home, name: &str, out: &mut dyn Write) -> Result<()> {
    let key = identity::load_signing(home)?;
    let g = load_grant(home, Some(name), None)?;
    let path = home.revoked_path();
    let mut list = grant::load_revocations(home, &path, &key.verifying_key())?;
    let id = g.grant.id();
    if list.entries.iter().any(|r| r.id == id) {
        w(
            out,
            format!("grant {name} ({}) was already revoked", short(&id)),
        );
        return Ok(());
    }
    list.entries.push(Revocation {
        id: id.clone(),
        name: name.to_string(),
        at: fsutil::now_secs(),
    });
    let seq = grant::save_revocations(home, &list, &key)?;
    w(
        out,
        format!(
            "revoked grant {name} ({}); revocation list sequence {seq}; running leases under it stop within a second",
            short(&id)
        ),
    );
    Ok(())
}

/// One row of `list`.
#[derive(serde::Serialize)]
pub struct ListRow {
    pub name: String,
    pub caps: String,
    pub expires: u64,
    pub status: String,
    pub model: String,
}

/// `list`: every stored grant with its status (valid, expired, revoked, or why it is invalid).
pub fn list(home: &Home, json: bool, out: &mut dyn Write) -> Result<()> {
    let issuer = identity::load_public(&home.pub_path())?;
    let revoked = grant::load_revocations(home, &home.revoked_path(), &issuer)?;
    let now = fsutil::now_secs();
    let mut rows = Vec::new();
    let dir = home.grants_dir();
    let mut entries: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(GuardError::io("list", &dir, e)),
    };
    entries.sort();
    for p in entries
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
    {
        let row = match grant::load(&p) {
            Ok(g) => {
                let status = match g.verify(&issuer, now, &revoked) {
                    Ok(()) => format!("valid ({} left)", human_secs(g.grant.expires - now)),
                    Err(_) if revoked.revokes(&g) => "revoked".into(),
                    Err(_) if now >= g.grant.expires => "expired".into(),
                    Err(e) => format!("invalid: {e}"),
                };
                ListRow {
                    name: g.grant.name.clone(),
                    caps: g.grant.caps().to_string(),
                    expires: g.grant.expires,
                    status,
                    model: g.grant.model_path.clone(),
                }
            }
            Err(e) => ListRow {
                name: p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                caps: String::new(),
                expires: 0,
                status: format!("invalid: {}", e.full()),
                model: String::new(),
            },
        };
        rows.push(row);
    }
    if json {
        w(out, serde_json::to_string_pretty(&rows).unwrap_or_default());
        return Ok(());
    }
    if rows.is_empty() {
        w(out, "no grants");
        return Ok(());
    }
    w(
        out,
        format!(
            "{:<20} {:<8} {:<12} {:<24} MODEL",
            "NAME", "CAPS", "EXPIRES", "STATUS"
        ),
    );
    for r in rows {
        let expires = if r.expires > now {
            format!("in {}", human_secs(r.expires - now))
        } else {
            "-".to_string()
        };
        w(
            out,
            format!(
                "{:<20} {:<8} {:<12} {:<24} {}",
                r.name, r.caps, expires, r.status, r.model
            ),
        );
    }
    Ok(())
}

/// Options of `verify`.
pub struct VerifyArgs<'a> {
    /// The grant file.
    pub grant: &'a Path,
    /// Issuer public key file (default: this node's `node.pub`).
    pub pubkey: Option<&'a Path>,
    /// Revocation list (default: this node's, when present).
    pub revocations: Option<&'a Path>,
    /// Also re-hash the model file.
    pub check_model: bool,
}

/// `verify`: offline check of a grant with the issuer's public key only.
pub fn verify(home: &Home, a: &VerifyArgs<'_>, out: &mut dyn Write) -> Result<()> {
    let pubkey = a
        .pubkey
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.pub_path());
    let issuer = identity::load_public(&pubkey)?;
    let rev_path = a
        .revocations
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.revoked_path());
    if a.revocations.is_some() && !rev_path.exists() {
        return Err(GuardError::io(
            "read",
            &rev_path,
            std::io::ErrorKind::NotFound.into(),
        ));
    }
    let revoked = grant::load_revocations(home, &rev_path, &issuer)?;
    let g = grant::load(a.grant)?;
    let now = fsutil::now_secs();
    g.verify(&issuer, now, &revoked)?;
    if a.check_model {
        check_model(&g.grant)?;
    }
    let c = g.chain();
    w(
        out,
        format!(
            "valid: grant {} ({}) caps {} expires in {}; {} link(s) signed by {}; model {} blake3 {}{}",
            g.grant.name,
            short(&g.grant.id()),
            g.grant.caps(),
            human_secs(g.grant.expires - now),
            c.len(),
            short(&hex(issuer.as_bytes())),
            g.grant.model_path,
            short(&g.grant.model_hash),
            if a.check_model { " (re-hashed, unchanged)" } else { "" }
        ),
    );
    Ok(())
}

/// `attenuate`: derives a narrower child grant and writes it to `dest` (or `out`).
pub fn attenuate(
    home: &Home,
    parent: &Path,
    caps: Option<&Caps>,
    ttl: Option<Duration>,
    dest: Option<&Path>,
    out: &mut dyn Write,
) -> Result<SignedGrant> {
    let key = identity::load_signing(home)?;
    let p = grant::load(parent)?;
    let revoked = grant::load_revocations(home, &home.revoked_path(), &key.verifying_key())?;
    let child = grant::attenuate(
        &p,
        caps,
        ttl.map(|d| d.as_secs().max(1)),
        &key,
        fsutil::now_secs(),
        &revoked,
    )?;
    match dest {
        Some(d) => {
            grant::save(&child, d)?;
            w(
                out,
                format!(
                    "attenuated grant {} ({}) caps {} expires at {} written to {}",
                    child.grant.name,
                    short(&child.grant.id()),
                    child.grant.caps(),
                    child.grant.expires,
                    d.display()
                ),
            );
        }
        None => {
            let _ = out.write_all(&child.to_bytes());
        }
    }
    Ok(child)
}

/// `pubkey export`: prints the node's public key or writes it to a file.
pub fn pubkey_export(home: &Home, dest: Option<&Path>, out: &mut dyn Write) -> Result<()> {
    let k = identity::load_public(&home.pub_path())?;
    let text = format!("{}\n", hex(k.as_bytes()));
    match dest {
        Some(d) => {
            fsutil::write_atomic(d, text.as_bytes(), 0o644)?;
            w(out, format!("public key written to {}", d.display()));
        }
        None => {
            let _ = out.write_all(text.as_bytes());
        }
    }
    Ok(())
}
