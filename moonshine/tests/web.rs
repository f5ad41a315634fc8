//! The gateway's web page in a real browser: headless Debian `chromium` driven over the
//! WebDriver protocol (`chromedriver`), on SmolLM2-135M split over two stations. The page
//! loads under its CSP, lists the models, streams a chat answer, stops one mid-stream, and
//! shows both hops with their layer ranges, health and per-token cost; its screenshot is
//! checked not to be blank and kept at `target/web/moonshine-page.png`.
//!
//! Needs `chromium` and `chromium-driver` (scripts/test.sh installs them when root): absent,
//! the test skips with a line unless `AEON_REQUIRE_BROWSER=1`. The model and the station
//! binary follow test-support's rule (`AEON_REQUIRE_MODELS`).

#![allow(clippy::result_large_err)] // ureq::Error is what the helpers pass on.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use support::*;

/// SmolLM2-135M's blocks, split over the two stations.
const LAYERS: u32 = 30;

/// An executable on `PATH` (or `$env` when set).
fn which(name: &str, env: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Chromium and its driver, or `None` (skip) unless `AEON_REQUIRE_BROWSER=1`.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let found = which("chromium", "CHROMIUM_BIN").zip(which("chromedriver", "CHROMEDRIVER_BIN"));
    if found.is_none() {
        let how =
            "apt-get install chromium chromium-driver, or set CHROMIUM_BIN and CHROMEDRIVER_BIN";
        if std::env::var("AEON_REQUIRE_BROWSER").as_deref() == Ok("1") {
            panic!("chromium or chromedriver not found and AEON_REQUIRE_BROWSER=1: {how}");
        }
        eprintln!("skipping: chromium or chromedriver not found ({how})");
    }
    found
}

/// A chromedriver process, killed on drop.
struct Driver {
    child: Child,
    url: String,
    agent: ureq::Agent,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start(bin: &Path) -> Driver {
        let port = test_support::free_port();
        let child = Command::new(bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let d = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(60))
                .build(),
        };
        let ready = wait_for(Duration::from_secs(15), || {
            let s = d.agent.get(&format!("{}/status", d.url)).call().ok()?;
            let v = json_of(s).ok()?;
            v["value"]["ready"].as_bool().filter(|&r| r)
        });
        assert!(ready.is_some(), "chromedriver did not become ready");
        d
    }

    /// A WebDriver command; the answer's `value`, or a panic naming the WebDriver error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.url);
        let r = match body {
            Some(b) => send(self.agent.request(method, &url), &b),
            None => self.agent.request(method, &url).call(),
        };
        match r {
            Ok(r) => json_of(r).expect("WebDriver JSON")["value"].take(),
            Err(ureq::Error::Status(code, r)) => {
                panic!(
                    "WebDriver {method} {path}: {code} {}",
                    r.into_string().unwrap_or_default()
                )
            }
            Err(e) => panic!("WebDriver {method} {path}: {e}"),
        }
    }
}

/// A browser session, ended on drop (so chromium exits before its driver is killed).
struct Session<'a> {
    d: &'a Driver,
    id: String,
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = self
            .d
            .agent
            .delete(&format!("{}/session/{}", self.d.url, self.id))
            .call();
    }
}

impl<'a> Session<'a> {
    fn new(d: &'a Driver, chromium: &Path, profile: &Path) -> Session<'a> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                         "--hide-scrollbars", "--window-size=1280,860",
                         format!("--user-data-dir={}", profile.display())],
                "prefs": {"download.default_directory": profile.join("downloads"),
                          "download.prompt_for_download": false},
            },
        }}});
        let v = d.call("POST", "/session", Some(caps));
        let id = v["sessionId"].as_str().expect("sessionId").to_string();
        Session { d, id }
    }

    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.d
            .call(method, &format!("/session/{}{path}", self.id), body)
    }

    fn open(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({"url": url})));
    }

    /// The element `css` selects, if any.
    fn find(&self, css: &str) -> Option<String> {
        let url = format!("{}/session/{}/element", self.d.url, self.id);
        let r = send(
            self.d.agent.post(&url),
            &json!({"using": "css selector", "value": css}),
        )
        .ok()?;
        let v = json_of(r).ok()?;
        v["value"]
            .as_object()?
            .values()
            .next()?
            .as_str()
            .map(str::to_string)
    }

    fn element(&self, css: &str) -> String {
        self.find(css).unwrap_or_else(|| panic!("no element {css}"))
    }

    fn text(&self, css: &str) -> String {
        let e = self.element(css);
        self.cmd("GET", &format!("/element/{e}/text"), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn attr(&self, css: &str, name: &str) -> Option<String> {
        let e = self.find(css)?;
        self.cmd("GET", &format!("/element/{e}/attribute/{name}"), None)
            .as_str()
            .map(str::to_string)
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.cmd("POST", &format!("/element/{e}/click"), Some(json!({})));
    }

    /// Replaces a field's value with `text`.
    fn fill(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.cmd("POST", &format!("/element/{e}/clear"), Some(json!({})));
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({"text": text})),
        );
    }

    /// Runs `script` (a function body) in the page; its return value.
    fn exec(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Runs `script` in the page; it calls `arguments[0]` with the result.
    fn exec_async(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Emulates a viewport of `w`x`h` CSS pixels (Chrome's DevTools protocol through
    /// chromedriver: a headless window cannot be made phone-narrow otherwise).
    fn viewport(&self, w: u32, h: u32) {
        self.cmd(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": "Emulation.setDeviceMetricsOverride",
                        "params": {"width": w, "height": h, "deviceScaleFactor": 1,
                                   "mobile": w < 600}})),
        );
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.cmd("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().expect("base64 screenshot"))
            .expect("decode screenshot")
    }

    /// The browser console so far (chromedriver's log endpoint): (level, message).
    fn console(&self) -> Vec<(String, String)> {
        let v = self.cmd("POST", "/se/log", Some(json!({"type": "browser"})));
        v.as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (s("level"), s("message"))
            })
            .collect()
    }
}

/// POSTs (or the request's method with) a JSON body.
fn send(req: ureq::Request, body: &Value) -> Result<ureq::Response, ureq::Error> {
    req.set("content-type", "application/json")
        .send_string(&body.to_string())
}

/// A response's JSON body.
fn json_of(r: ureq::Response) -> Result<Value, String> {
    let t = r.into_string().map_err(|e| e.to_string())?;
    serde_json::from_str(&t).map_err(|e| e.to_string())
}

/// Polls `f` every 100 ms until it gives `Some` or `limit` passes.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Distinct RGB colours of a PNG, and its size.
fn colours(png_bytes: &[u8]) -> (usize, u32, u32) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG frame");
    let px = info.color_type.samples();
    let mut seen = std::collections::HashSet::new();
    for p in buf[..info.buffer_size()].chunks_exact(px) {
        seen.insert((p[0], p[1 % px], p[2 % px]));
    }
    (seen.len(), info.width, info.height)
}

/// Where the screenshot is kept for people to look at: `target/web/`.
fn screenshot_path() -> PathBuf {
    shot_path("moonshine-page.png")
}

/// `target/web/NAME` (screenshots people look at).
fn shot_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("web").join(name)
}

#[test]
fn the_page_chats_streams_stops_and_shows_the_mesh_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let (Some(knot), Some(bin)) = (test_support::model(test_support::SMOLLM2), station_bin())
    else {
        return;
    };
    let t0 = Instant::now();
    let half = LAYERS / 2;
    let entry = station(
        &bin,
        &knot,
        &["--role", "entry", "--layers", &format!("0..{half}")],
    );
    let exit = station(
        &bin,
        &knot,
        &["--role", "exit", "--layers", &format!("{half}..{LAYERS}")],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = dir.path().join("mesh.json");
    let m = json!({"model": "smollm2-2hop", "stations": [
        {"url": entry.url, "layers": format!("0-{half}")},
        {"url": exit.url, "layers": format!("{half}-{LAYERS}")}]});
    std::fs::write(&mesh, m.to_string()).expect("write mesh");
    let gw = spawn_listening(
        Path::new(env!("CARGO_BIN_EXE_moonshine")),
        &["serve", "--mesh", mesh.to_str().expect("utf-8")],
    );

    // The page's files: their types, the CSP and nosniff; no other method.
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    for (path, ty) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/app.css", "text/css"),
        ("/favicon.svg", "image/svg+xml"),
    ] {
        let r = agent
            .get(&format!("{}{path}", gw.url))
            .call()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert!(
            r.content_type().starts_with(ty),
            "{path}: {}",
            r.content_type()
        );
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.starts_with("default-src 'self'"), "{path}: CSP {csp:?}");
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
    }
    match agent.post(&format!("{}/", gw.url)).send_string("x") {
        Err(ureq::Error::Status(405, _)) => {}
        other => panic!("POST / should be 405: {other:?}"),
    }
    let view: Value = agent
        .get(&format!("{}/mesh", gw.url))
        .call()
        .expect("GET /mesh")
        .into_string()
        .map(|t| serde_json::from_str(&t))
        .expect("read /mesh")
        .expect("mesh JSON");
    let hops = &view["chains"][0]["hops"];
    assert_eq!(hops[0]["layers"], format!("0-{half}"), "{view}");
    assert_eq!(hops[1]["status"], "ok", "{view}");

    // With --api-key the page's files stay public (a browser sends no key when it opens a
    // page) and /mesh, like the API, asks for the key.
    {
        let keyed = spawn_listening(
            Path::new(env!("CARGO_BIN_EXE_moonshine")),
            &[
                "serve",
                "--mesh",
                mesh.to_str().expect("utf-8"),
                "--api-key",
                "k-1",
            ],
        );
        let get = |path: &str, key: Option<&str>| {
            let mut r = agent.get(&format!("{}{path}", keyed.url));
            if let Some(k) = key {
                r = r.set("authorization", &format!("Bearer {k}"));
            }
            match r.call() {
                Ok(r) => r.status(),
                Err(ureq::Error::Status(s, _)) => s,
                Err(e) => panic!("GET {path}: {e}"),
            }
        };
        assert_eq!(get("/", None), 200);
        assert_eq!(get("/app.js", None), 200);
        assert_eq!(get("/mesh", None), 401);
        assert_eq!(get("/mesh", Some("k-1")), 200);
    }

    let driver = Driver::start(&chromedriver);
    let profile = dir.path().join("chromium");
    let s = Session::new(&driver, &chromium, &profile);
    s.open(&format!("{}/", gw.url));

    // The mesh view: both hops with their layer ranges, healthy.
    let chains = wait_for(Duration::from_secs(10), || {
        let t = s.text("#chains");
        (t.contains(&format!("layers 0-{half}")) && t.contains(&format!("layers {half}-{LAYERS}")))
            .then_some(t)
    })
    .unwrap_or_else(|| {
        panic!(
            "the mesh view never listed both hops: {:?}",
            s.text("#chains")
        )
    });
    assert!(
        chains.contains(&entry.url) && chains.contains(&exit.url),
        "{chains}"
    );
    assert_eq!(s.text("#status"), "mesh ok");
    // The model list from /v1/models.
    let model = wait_for(Duration::from_secs(5), || s.attr("#model option", "value"));
    assert_eq!(model.as_deref(), Some("smollm2-2hop"));

    // A chat turn, greedy, into the page.
    s.fill("#temperature", "0");
    s.fill("#max_tokens", "48");
    s.fill(
        "#prompt",
        "What is the capital of France? Answer in one sentence.",
    );
    s.click("#send");
    let meta = wait_for(Duration::from_secs(30), || {
        s.find(".msg.assistant .meta")
            .map(|_| s.text(".msg.assistant .meta"))
    })
    .expect("the answer never finished");
    let answer = s.text(".msg.assistant .body");
    eprintln!("answer: {answer:?}");
    assert!(
        meta.starts_with("stop") || meta.starts_with("length"),
        "finish: {meta:?}"
    );
    assert!(meta.contains("tokens"), "{meta}");
    let reply = answer.trim();
    assert!(!reply.is_empty(), "empty answer: {answer:?}");
    assert!(!s
        .attr(".msg.assistant", "class")
        .unwrap_or_default()
        .contains("error"));

    // After the generation the mesh view shows each hop's cost per token and tokens/s.
    let costs = wait_for(Duration::from_secs(6), || {
        let t = s.text("#chains");
        (t.matches("ms/token").count() == 2).then_some(t)
    })
    .unwrap_or_else(|| panic!("no per-hop cost: {}", s.text("#chains")));
    eprintln!("mesh view: {costs:?}; {}", s.text("#mesh-summary"));
    assert!(!s.text("#mesh-summary").contains("tokens/s \u{2013}"));

    // Streaming and Stop: a long answer shows text while it is still streaming, then Stop
    // aborts the fetch and the gateway counts a cancellation.
    let last = ".msg.assistant:last-of-type";
    s.fill("#max_tokens", "2000");
    s.fill(
        "#prompt",
        "Write a long story about a dragon who learns to bake bread.",
    );
    s.click("#send");
    let partial = wait_for(Duration::from_secs(20), || {
        let t = s.text(&format!("{last} .body"));
        let class = s.attr(last, "class").unwrap_or_default();
        (class.contains("streaming") && t.len() > 4).then_some(t)
    })
    .expect("no text appeared while the second answer streamed");
    eprintln!("mid-stream: {partial:?}");
    s.click("#stop");
    let meta2 = wait_for(Duration::from_secs(10), || {
        s.find(&format!("{last} .meta"))
            .map(|_| s.text(&format!("{last} .meta")))
    })
    .expect("Stop did not end the answer");
    assert!(meta2.starts_with("stopped"), "{meta2}");
    let cancelled = wait_for(Duration::from_secs(10), || {
        let m = agent
            .get(&format!("{}/metrics", gw.url))
            .call()
            .ok()?
            .into_string()
            .ok()?;
        m.lines()
            .any(|l| l == "moonshine_cancelled_total 1")
            .then_some(())
    });
    assert!(cancelled.is_some(), "the gateway did not see the stop");

    // Let the mesh view catch up with the stopped generation, then the screenshot.
    std::thread::sleep(Duration::from_millis(2200));
    let png = s.screenshot();
    let (n, w, h) = colours(&png);
    let path = screenshot_path();
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir target/web");
    std::fs::write(&path, &png).expect("write screenshot");
    eprintln!("screenshot {}: {w}x{h}, {n} colours", path.display());
    assert!(w >= 800 && h >= 600, "{w}x{h}");
    assert!(n > 50, "a blank page? {n} distinct colours");

    // Nothing went wrong in the page: no script or style refused by the policy (a CSP
    // violation is a console error), no failed load, no exception.
    let console = s.console();
    eprintln!("browser console: {console:?}");
    let errors: Vec<_> = console
        .iter()
        .filter(|(level, _)| level == "SEVERE")
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");
    eprintln!("browser test took {:.1} s", t0.elapsed().as_secs_f64());
}

/// A reply with Markdown, a code block and markup the model wrote, as a stored conversation.
const SEEDED: &str = "Here is **bold** text and a list:\n\n- one\n- two\n\n```rust\nfn main() {\n    let x = 42;\n    println!(\"{x}\");\n}\n```\n\n<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">";

#[test]
fn the_page_renders_markdown_copies_regenerates_keeps_conversations_and_fits_a_phone() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let (Some(knot), Some(bin)) = (test_support::model(test_support::SMOLLM2), station_bin())
    else {
        return;
    };
    let full = station(&bin, &knot, &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = dir.path().join("mesh.json");
    let m = json!({"model": "smollm2", "stations": [{"url": full.url, "layers": format!("0-{LAYERS}")}]});
    std::fs::write(&mesh, m.to_string()).expect("write mesh");
    let gw = spawn_listening(
        Path::new(env!("CARGO_BIN_EXE_moonshine")),
        &["serve", "--mesh", mesh.to_str().expect("utf-8")],
    );
    let driver = Driver::start(&chromedriver);
    let profile = dir.path().join("chromium");
    let s = Session::new(&driver, &chromium, &profile);
    s.viewport(1280, 720);
    s.open(&format!("{}/", gw.url));
    wait_for(Duration::from_secs(10), || s.attr("#model option", "value"))
        .expect("the page never listed the model");

    // A stored conversation: after a reload it is listed and its Markdown rendered.
    let seeded = json!([{"id": "c1", "title": "Seeded", "updated": 1, "messages": [
        {"role": "user", "content": "Show me some Rust."},
        {"role": "assistant", "content": SEEDED}]}]);
    s.exec(&format!(
        "localStorage.setItem('moonshine.conversations', {}); localStorage.setItem('moonshine.current', 'c1');",
        serde_json::to_string(&seeded.to_string()).expect("json")
    ));
    s.cmd("POST", "/refresh", Some(json!({})));
    let strong = wait_for(Duration::from_secs(10), || {
        s.find(".msg.assistant .body strong")
            .map(|_| s.text(".msg.assistant .body strong"))
    })
    .expect("the Markdown never rendered");
    assert_eq!(strong, "bold");
    assert_eq!(s.text(".conv.current .title"), "Seeded");
    assert!(s.find(".msg.assistant .body li").is_some(), "no list");
    // The code block: coloured spans from the gateway's highlighter, its text intact.
    let code = s.exec(
        "const c = document.querySelector('.msg.assistant pre code');\
         const colours = new Set([...c.querySelectorAll('span')].map(e => getComputedStyle(e).color));\
         return [c.textContent, colours.size, c.parentElement.dataset.lang];",
    );
    assert_eq!(
        code[0].as_str(),
        Some("fn main() {\n    let x = 42;\n    println!(\"{x}\");\n}\n")
    );
    assert!(code[1].as_u64().unwrap_or(0) >= 3, "highlighting: {code}");
    assert_eq!(code[2], "rust");
    // The markup the model wrote is text on the page, and nothing of it ran.
    let body = s.text(".msg.assistant .body");
    assert!(body.contains("<script>window.pwned = 1</script>"), "{body}");
    assert!(body.contains("<img src=x"), "{body}");
    assert_eq!(s.exec("return document.querySelectorAll('.msg script, .msg img').length + (window.pwned || 0);"), 0);

    // Copy puts the reply's Markdown source on the clipboard.
    for name in ["clipboard-read", "clipboard-write"] {
        s.cmd(
            "POST",
            "/permissions",
            Some(json!({"descriptor": {"name": name}, "state": "granted"})),
        );
    }
    s.click(".msg.assistant .actions .copy");
    let clip = s.exec_async(
        "const done = arguments[0]; setTimeout(() => navigator.clipboard.readText().then(done, e => done('ERR ' + e)), 200);",
    );
    assert_eq!(clip.as_str(), Some(SEEDED));

    // A real turn, greedy; then Regenerate asks the same turn again: the same answer, in
    // the same place.
    s.fill("#temperature", "0");
    s.fill("#max_tokens", "24");
    s.fill("#prompt", "Name three colours.");
    s.click("#send");
    let done = |n: usize| {
        wait_for(Duration::from_secs(30), || {
            let k = s.exec("return document.querySelectorAll('.msg.assistant .meta').length;");
            (k.as_u64() == Some(n as u64)).then_some(())
        })
    };
    done(1).expect("the answer never finished");
    let first = s.text(".msg.assistant:last-of-type .body");
    assert!(!first.trim().is_empty());
    s.click(".msg.assistant:last-of-type .actions .regenerate");
    // The old answer goes at once, the new one finishes.
    done(1).expect("the regenerated answer never finished");
    assert_eq!(
        s.exec("return document.querySelectorAll('.msg').length;"),
        4
    );
    assert_eq!(s.text(".msg.assistant:last-of-type .body"), first);

    // The conversation survives a reload, both turns.
    s.cmd("POST", "/refresh", Some(json!({})));
    wait_for(Duration::from_secs(10), || {
        (s.exec("return document.querySelectorAll('.msg.assistant .body.md').length;") == 2)
            .then_some(())
    })
    .expect("the conversation did not come back after a reload");
    assert_eq!(s.text(".msg.assistant:last-of-type .body"), first);

    // Screenshots and no horizontal scroll at 1280x720 and on a phone (360x640).
    for (w, h) in [(1280, 720), (360, 640)] {
        s.viewport(w, h);
        std::thread::sleep(Duration::from_millis(300));
        let size = s.exec(
            "const d = document.documentElement; return [d.scrollWidth, d.clientWidth, innerWidth];",
        );
        eprintln!("{w}x{h}: scrollWidth, clientWidth, innerWidth = {size}");
        assert_eq!(size[2], w, "the viewport did not take {w}x{h}");
        assert!(
            size[0].as_u64() <= size[1].as_u64(),
            "horizontal scroll at {w}x{h}: {size}"
        );
        let png = s.screenshot();
        let path = shot_path(&format!("moonshine-{w}x{h}.png"));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir target/web");
        std::fs::write(&path, &png).expect("write screenshot");
        let (n, pw, ph) = colours(&png);
        eprintln!("screenshot {}: {pw}x{ph}, {n} colours", path.display());
        assert!(n > 50, "a blank page at {w}x{h}? {n} colours");
    }
    s.viewport(1280, 720);

    // Edit and resend: the last question goes back into the box, the turns after it go.
    s.click(".msg.user:nth-last-of-type(2) .actions .edit");
    assert_eq!(
        s.exec("return document.getElementById('prompt').value;"),
        "Name three colours."
    );
    assert_eq!(
        s.exec("return document.querySelectorAll('.msg').length;"),
        2
    );
    s.fill("#prompt", "Name three animals.");
    s.click("#send");
    done(1).expect("the edited question was not answered");
    assert_eq!(s.exec("return JSON.parse(localStorage.getItem('moonshine.conversations'))[0].messages[2].content;"), "Name three animals.");

    // Rename, export, a new conversation, delete.
    s.click(".conv.current .rename");
    let input = s.element(".conv .rename-input");
    // Select all (Ctrl+A, released by NULL), type the name, Enter.
    s.cmd(
        "POST",
        &format!("/element/{input}/value"),
        Some(json!({"text": "\u{E009}a\u{E000}Rusty\u{E007}"})),
    );
    assert_eq!(s.text(".conv.current .title"), "Rusty");
    s.click("#export");
    let file = profile.join("downloads/moonshine-conversations.json");
    let exported = wait_for(Duration::from_secs(10), || {
        let t = std::fs::read_to_string(&file).ok()?;
        serde_json::from_str::<Value>(&t).ok()
    })
    .unwrap_or_else(|| panic!("no export at {}", file.display()));
    assert_eq!(exported["conversations"][0]["title"], "Rusty", "{exported}");
    assert_eq!(
        exported["conversations"][0]["messages"][1]["content"],
        SEEDED
    );
    s.click("#new-conv");
    s.fill("#prompt", "Hello");
    s.click("#send");
    done(1).expect("the new conversation's answer never finished");
    assert_eq!(
        s.exec("return document.querySelectorAll('#conv-list li').length;"),
        2
    );
    s.click(".conv.current .delete");
    assert_eq!(
        s.exec("return document.querySelectorAll('#conv-list li').length;"),
        1
    );
    assert_eq!(
        s.exec(
            "return JSON.parse(localStorage.getItem('moonshine.conversations')).map(c => c.title);"
        ),
        json!(["Rusty"])
    );

    let console = s.console();
    let errors: Vec<_> = console.iter().filter(|(l, _)| l == "SEVERE").collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}
