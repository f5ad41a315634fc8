//! `/v1/embeddings` on the real Qwen2.5-Coder-0.5B against llama.cpp: the golden
//! (scripts/reference/make-embeddings-golden.sh: llama.cpp 0.3.36, embeddings on, mean
//! pooling, L2-normalised) holds the vectors of the 20 lines of golden/embeddings/texts.txt;
//! ours, through a station's one-trip `/chain` whose exit answers the final hidden states,
//! must be within cosine 0.999 of each, over one station and over a two-hop mesh.

mod support;

use base64::Engine as _;
use serde_json::{json, Value};
use support::*;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/embeddings");

fn post(url: &str, body: &Value) -> Result<Value, (u16, Value)> {
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(300))
        .build();
    match agent.post(url).send_string(&body.to_string()) {
        Ok(r) => Ok(serde_json::from_str(&r.into_string().expect("body")).expect("json")),
        Err(ureq::Error::Status(s, r)) => Err((
            s,
            serde_json::from_str(&r.into_string().unwrap_or_default()).unwrap_or(Value::Null),
        )),
        Err(e) => panic!("POST {url}: {e}"),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn vectors(v: &Value) -> Vec<Vec<f32>> {
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .expect("a float array")
                .iter()
                .map(|x| x.as_f64().expect("a number") as f32)
                .collect()
        })
        .collect()
}

fn gateway(args: &[&str]) -> Proc {
    spawn_listening(std::path::Path::new(env!("CARGO_BIN_EXE_moonshine")), args)
}

#[test]
fn embeddings_match_llama_cpp_on_twenty_texts_over_one_station_and_a_mesh() {
    let Some((knot, bin)) = setup() else { return };
    let texts: Vec<String> = std::fs::read_to_string(format!("{GOLDEN}/texts.txt"))
        .expect("texts")
        .lines()
        .map(String::from)
        .collect();
    let raw = std::fs::read(format!("{GOLDEN}/qwen_mean.f32")).expect("golden");
    let gold: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let counts: usize = std::fs::read_to_string(format!("{GOLDEN}/qwen_tokens.txt"))
        .expect("counts")
        .split_whitespace()
        .map(|c| c.parse::<usize>().expect("a count"))
        .sum();
    assert_eq!(texts.len(), 20);
    let dim = gold.len() / texts.len();
    assert_eq!(dim, 896, "Qwen2.5-0.5B's hidden size");

    let st = station(&bin, &knot, &[]);
    let gw = gateway(&["serve", "--station", &st.url]);
    let url = format!("{}/v1/embeddings", gw.url);
    let r = post(&url, &json!({"model": "m", "input": texts})).expect("embeddings");
    let ours = vectors(&r);
    assert_eq!(ours.len(), 20);
    assert_eq!(
        r["usage"]["prompt_tokens"], counts,
        "llama.cpp's token counts"
    );
    for (i, (v, g)) in ours.iter().zip(gold.chunks_exact(dim)).enumerate() {
        assert_eq!(v.len(), dim);
        let c = cosine(v, g);
        eprintln!("text {i}: cosine {c:.5}");
        assert!(c >= 0.999, "text {i} {:?}: cosine {c}", texts[i]);
        let norm: f64 = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "not normalised: {norm}");
    }

    // base64: the same floats, little-endian; token ids: the same vector as the text.
    let one = post(
        &url,
        &json!({"input": texts[0], "encoding_format": "base64"}),
    )
    .expect("b64");
    let b = base64::engine::general_purpose::STANDARD
        .decode(
            one["data"][0]["embedding"]
                .as_str()
                .expect("a base64 string"),
        )
        .expect("base64");
    let decoded: Vec<f32> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(decoded, ours[0]);
    let tok: Value = serde_json::from_str(
        &ureq::post(&format!("{}/tokenize", st.url))
            .send_string(&json!({"text": texts[0]}).to_string())
            .expect("tokenize")
            .into_string()
            .expect("body"),
    )
    .expect("json");
    let ids = tok["tokens"].clone();
    let by_ids = post(&url, &json!({"input": ids})).expect("ids");
    assert_eq!(vectors(&by_ids)[0], ours[0]);
    let lists = post(&url, &json!({"input": [ids, ids]})).expect("id lists");
    assert_eq!(vectors(&lists), vec![ours[0].clone(), ours[0].clone()]);

    // Bad input: a 400 in OpenAI's shape naming the field, never a hang.
    let long = "This is a test ".repeat(40_000);
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": [1, 2, 9999999]}), "input"),
        (
            json!({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}}),
            "input",
        ),
        (json!({"input": "a", "dimensions": 64}), "dimensions"),
        (
            json!({"input": "a", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": long}), "input"),
    ] {
        let (status, e) = post(&url, &body).expect_err("refused");
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{e}"
        );
    }

    // Over a two-hop mesh: the exit's ask travels with the residual; the same vectors.
    let exit = station(&bin, &knot, &["--role", "exit", "--layers", "12..24"]);
    let entry = station(
        &bin,
        &knot,
        &[
            "--role",
            "entry",
            "--layers",
            "0..12",
            "--route-to",
            &exit.url,
        ],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = dir.path().join("mesh.json");
    let m = json!({"model": "qwen-2hop", "stations": [{"url": entry.url, "layers": "0-12"}, {"url": exit.url, "layers": "12-24"}]});
    std::fs::write(&mesh, m.to_string()).expect("write mesh");
    let gw2 = gateway(&["serve", "--mesh", mesh.to_str().expect("utf-8")]);
    let r2 = post(
        &format!("{}/v1/embeddings", gw2.url),
        &json!({"input": &texts[..3]}),
    )
    .expect("mesh embeddings");
    for (i, (a, b)) in vectors(&r2).iter().zip(&ours).enumerate() {
        let c = cosine(a, b);
        assert!(c > 0.99999, "text {i} over the mesh: cosine {c}");
    }
}
