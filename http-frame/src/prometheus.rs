//! Prometheus text exposition: a fixed-bucket histogram and the text writer, the one home of
//! the format (the station's and the gateway's `/metrics` both write with them).
//! Gauges never end in `_total`; counters always do; durations are seconds.

use std::sync::Mutex;

/// A Prometheus histogram with fixed upper bounds.
pub struct Histogram {
    bounds: &'static [f64],
    /// (count per bound, then +Inf; sum; count).
    state: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            state: Mutex::new((vec![0; bounds.len() + 1], 0.0, 0)),
        }
    }

    /// Records one value.
    pub fn observe(&self, v: f64) {
        if let Ok(mut s) = self.state.lock() {
            let i = self
                .bounds
                .iter()
                .position(|&b| v <= b)
                .unwrap_or(self.bounds.len());
            s.0[i] += 1;
            s.1 += v;
            s.2 += 1;
        }
    }

    /// The `_bucket{LABELS,le=..}` (cumulative), `_sum{LABELS}` and `_count{LABELS}` lines,
    /// each as (suffix with labels, value); `labels` is `a="x",b="y"` or empty.
    pub fn lines(&self, labels: &str) -> Vec<(String, String)> {
        let Ok(s) = self.state.lock() else {
            return Vec::new();
        };
        let sep = if labels.is_empty() { "" } else { "," };
        let plain = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let mut out = Vec::new();
        let mut acc = 0;
        for (i, n) in s.0.iter().enumerate() {
            acc += n;
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            out.push((
                format!("_bucket{{{labels}{sep}le=\"{le}\"}}"),
                acc.to_string(),
            ));
        }
        out.push((format!("_sum{plain}"), format!("{:.6}", s.1)));
        out.push((format!("_count{plain}"), s.2.to_string()));
        out
    }
}

/// Writes Prometheus text: one family at a time.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// A family `name` of `kind` (`counter`, `gauge`, `histogram`) with its lines, each
    /// (suffix with labels, value) after the name.
    pub fn family(&mut self, name: &str, kind: &str, help: &str, lines: Vec<(String, String)>) {
        self.text
            .push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (suffix, v) in lines {
            self.text.push_str(&format!("{name}{suffix} {v}\n"));
        }
    }

    /// A family with one unlabelled value.
    pub fn one(&mut self, name: &str, kind: &str, help: &str, v: impl ToString) {
        self.family(name, kind, help, vec![(String::new(), v.to_string())]);
    }

    /// The text.
    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_labelled() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let lines = h.lines("route=\"/x\"");
        assert_eq!(
            lines[..3],
            [
                (
                    "_bucket{route=\"/x\",le=\"0.1\"}".to_string(),
                    "1".to_string()
                ),
                (
                    "_bucket{route=\"/x\",le=\"1\"}".to_string(),
                    "3".to_string()
                ),
                (
                    "_bucket{route=\"/x\",le=\"+Inf\"}".to_string(),
                    "4".to_string()
                ),
            ]
        );
        assert_eq!(
            lines[4],
            ("_count{route=\"/x\"}".to_string(), "4".to_string())
        );
        assert_eq!(Histogram::new(&[1.0]).lines("")[2].0, "_sum");
    }
}
