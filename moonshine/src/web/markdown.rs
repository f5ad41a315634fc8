//! The page's Markdown: a model's reply parsed on the gateway (pulldown-cmark) into a tree of
//! elements from a short whitelist, code blocks coloured by syntect, sent as JSON for the
//! page to build with `createElement` / `textContent` (`POST /render`).
//!
//! Why a tree and not HTML: no string the model wrote is ever parsed as markup, on either
//! side. Raw HTML in the reply stays text, a link keeps only an `http(s)` or `mailto`
//! target, images show their alt text (nothing is fetched), and a colour is `#rrggbb` from
//! the theme, never the model. The page keeps its CSP (`default-src 'self'`, no inline
//! script) and needs no script library of its own.

use std::sync::OnceLock;

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use serde::Serialize;
use syntect::easy::HighlightLines;
use syntect::highlighting::{Theme, ThemeSet};
use syntect::parsing::SyntaxSet;
use syntect::util::LinesWithEndings;

/// Code blocks longer than this are shown uncoloured (highlighting is regex work per line).
const MAX_HIGHLIGHT: usize = 64 * 1024;

/// One node of the rendered tree: text, or an element with children.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Node {
    Text(String),
    El(El),
}

/// An element; `t` is always one of [`TAGS`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct El {
    pub t: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
    /// A highlighted token's colour, `#rrggbb`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
    /// A code block's language as the fence named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
    pub c: Vec<Node>,
}

/// Every tag the tree may name (the page refuses any other).
pub const TAGS: &[&str] = &[
    "p",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "blockquote",
    "pre",
    "code",
    "ul",
    "ol",
    "li",
    "em",
    "strong",
    "del",
    "a",
    "hr",
    "br",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "span",
];

fn el(t: &'static str) -> El {
    El {
        t,
        href: None,
        color: None,
        lang: None,
        c: Vec::new(),
    }
}

fn syntaxes() -> &'static SyntaxSet {
    static S: OnceLock<SyntaxSet> = OnceLock::new();
    S.get_or_init(SyntaxSet::load_defaults_newlines)
}

fn theme() -> Option<&'static Theme> {
    static T: OnceLock<ThemeSet> = OnceLock::new();
    T.get_or_init(ThemeSet::load_defaults)
        .themes
        .get("base16-ocean.dark")
}

/// A link target the page may follow: web and mail only (no `javascript:`, `data:`, ...).
fn safe_href(url: &str) -> Option<String> {
    let lower = url.trim_start().to_ascii_lowercase();
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|p| lower.starts_with(p))
        .then(|| url.trim_start().to_string())
}

/// A code block's text as coloured spans, or one text node when the language is unknown,
/// the block too long or the highlighter fails.
fn highlight(code: &str, lang: &str) -> Vec<Node> {
    let plain = || vec![Node::Text(code.to_string())];
    let ss = syntaxes();
    let (Some(syntax), Some(theme)) = (
        (!lang.is_empty())
            .then(|| ss.find_syntax_by_token(lang))
            .flatten(),
        theme(),
    ) else {
        return plain();
    };
    if code.len() > MAX_HIGHLIGHT {
        return plain();
    }
    let mut h = HighlightLines::new(syntax, theme);
    let mut out = Vec::new();
    for line in LinesWithEndings::from(code) {
        let Ok(pieces) = h.highlight_line(line, ss) else {
            return plain();
        };
        for (style, text) in pieces {
            let f = style.foreground;
            let mut s = el("span");
            s.color = Some(format!("#{:02x}{:02x}{:02x}", f.r, f.g, f.b));
            s.c.push(Node::Text(text.to_string()));
            out.push(Node::El(s));
        }
    }
    out
}

/// The element a block or inline tag opens (`None`: its children go to the parent).
fn open(tag: &Tag, in_head: bool) -> Option<El> {
    Some(match tag {
        Tag::Paragraph => el("p"),
        Tag::Heading { level, .. } => el(match *level as usize {
            1 => "h1",
            2 => "h2",
            3 => "h3",
            4 => "h4",
            5 => "h5",
            _ => "h6",
        }),
        Tag::BlockQuote(_) => el("blockquote"),
        Tag::CodeBlock(kind) => {
            let mut e = el("pre");
            if let CodeBlockKind::Fenced(info) = kind {
                let lang = info.split_whitespace().next().unwrap_or_default();
                if !lang.is_empty() {
                    e.lang = Some(lang.to_string());
                }
            }
            e
        }
        Tag::List(Some(_)) => el("ol"),
        Tag::List(None) => el("ul"),
        Tag::Item => el("li"),
        Tag::Table(_) => el("table"),
        Tag::TableHead => el("thead"),
        Tag::TableRow => el("tr"),
        Tag::TableCell => el(if in_head { "th" } else { "td" }),
        Tag::Emphasis => el("em"),
        Tag::Strong => el("strong"),
        Tag::Strikethrough => el("del"),
        Tag::Link { dest_url, .. } => {
            let mut a = el("a");
            a.href = safe_href(dest_url);
            a
        }
        // An image shows its alt text: the page fetches nothing the model names.
        Tag::Image { .. } => el("span"),
        _ => return None,
    })
}

/// `text` (a model's reply, possibly cut mid-stream) as a tree of whitelisted elements.
pub fn render(text: &str) -> Vec<Node> {
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    // The open elements, innermost last; `None` marks a tag that adds no element.
    let mut stack: Vec<Option<El>> = Vec::new();
    let mut root: Vec<Node> = Vec::new();
    let mut in_head = false;
    let mut code: Option<(String, String)> = None; // (text, lang) of an open code block
    fn push(stack: &mut [Option<El>], root: &mut Vec<Node>, n: Node) {
        match stack.iter_mut().rev().find_map(Option::as_mut) {
            Some(e) => e.c.push(n),
            None => root.push(n),
        }
    }
    for ev in Parser::new_ext(text, opts) {
        match ev {
            Event::Start(tag) => {
                if matches!(tag, Tag::TableHead) {
                    in_head = true;
                }
                if let Tag::CodeBlock(kind) = &tag {
                    let lang = match kind {
                        CodeBlockKind::Fenced(i) => i.split_whitespace().next().unwrap_or(""),
                        CodeBlockKind::Indented => "",
                    };
                    code = Some((String::new(), lang.to_string()));
                }
                let e = open(&tag, in_head);
                // A head's cells sit in a row of their own.
                let head = matches!(tag, Tag::TableHead);
                stack.push(e);
                if head {
                    stack.push(Some(el("tr")));
                }
            }
            Event::End(end) => {
                if matches!(end, TagEnd::TableHead) {
                    in_head = false;
                    if let Some(Some(tr)) = stack.pop() {
                        push(&mut stack, &mut root, Node::El(tr));
                    }
                }
                let Some(top) = stack.pop() else { continue };
                let Some(mut e) = top else { continue };
                if matches!(end, TagEnd::CodeBlock) {
                    if let Some((body, lang)) = code.take() {
                        let mut c = el("code");
                        c.c = highlight(&body, &lang);
                        e.c = vec![Node::El(c)];
                    }
                }
                push(&mut stack, &mut root, Node::El(e));
            }
            Event::Text(t) => match code.as_mut() {
                Some((body, _)) => body.push_str(&t),
                None => push(&mut stack, &mut root, Node::Text(t.into_string())),
            },
            Event::Code(t) => {
                let mut c = el("code");
                c.c.push(Node::Text(t.into_string()));
                push(&mut stack, &mut root, Node::El(c));
            }
            // Markup the model wrote is shown as the characters it is.
            Event::Html(t) | Event::InlineHtml(t) => match code.as_mut() {
                Some((body, _)) => body.push_str(&t),
                None => push(&mut stack, &mut root, Node::Text(t.into_string())),
            },
            Event::SoftBreak => push(&mut stack, &mut root, Node::Text("\n".into())),
            Event::HardBreak => push(&mut stack, &mut root, Node::El(el("br"))),
            Event::Rule => push(&mut stack, &mut root, Node::El(el("hr"))),
            Event::TaskListMarker(done) => push(
                &mut stack,
                &mut root,
                Node::Text(if done { "[x] " } else { "[ ] " }.into()),
            ),
            Event::InlineMath(t) | Event::DisplayMath(t) => {
                push(&mut stack, &mut root, Node::Text(t.into_string()))
            }
            Event::FootnoteReference(t) => {
                push(&mut stack, &mut root, Node::Text(format!("[{t}]")))
            }
        }
    }
    // Whatever a cut-off stream left open is closed where it stands.
    while let Some(top) = stack.pop() {
        if let Some(e) = top {
            push(&mut stack, &mut root, Node::El(e));
        }
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(nodes: &[Node], out: &mut Vec<&'static str>) {
        for n in nodes {
            if let Node::El(e) = n {
                out.push(e.t);
                tags(&e.c, out);
            }
        }
    }

    fn text(nodes: &[Node]) -> String {
        nodes
            .iter()
            .map(|n| match n {
                Node::Text(t) => t.clone(),
                Node::El(e) => text(&e.c),
            })
            .collect()
    }

    #[test]
    fn emphasis_lists_and_a_highlighted_code_block() {
        let md =
            "Some **bold** and `x`.\n\n- one\n- two\n\n```rust\nfn main() { let x = 1; }\n```\n";
        let nodes = render(md);
        let mut t = Vec::new();
        tags(&nodes, &mut t);
        for want in ["p", "strong", "code", "ul", "li", "pre", "span"] {
            assert!(t.contains(&want), "{want} missing in {t:?}");
        }
        let Node::El(pre) = &nodes[2] else {
            panic!("{nodes:?}")
        };
        assert_eq!((pre.t, pre.lang.as_deref()), ("pre", Some("rust")));
        let Node::El(code) = &pre.c[0] else {
            panic!("{pre:?}")
        };
        let colours: std::collections::HashSet<_> = code
            .c
            .iter()
            .filter_map(|n| match n {
                Node::El(e) => e.color.clone(),
                _ => None,
            })
            .collect();
        assert!(colours.len() >= 2, "one colour for rust code: {colours:?}");
        assert!(colours.iter().all(|c| c.len() == 7 && c.starts_with('#')));
        assert_eq!(text(&code.c), "fn main() { let x = 1; }\n");
    }

    #[test]
    fn markup_and_script_from_the_model_stay_text() {
        let md = "<script>alert(1)</script>\n\nhi <img src=x onerror=alert(1)> [a](javascript:alert(1)) ![i](http://e/x.png) [ok](https://example.com)";
        let nodes = render(md);
        let mut t = Vec::new();
        tags(&nodes, &mut t);
        assert!(t.iter().all(|x| TAGS.contains(x)), "{t:?}");
        assert!(!t.contains(&"script") && !t.contains(&"img"));
        let all = text(&nodes);
        assert!(all.contains("<script>alert(1)</script>"), "{all}");
        assert!(all.contains("<img src=x onerror=alert(1)>"), "{all}");
        let json = serde_json::to_string(&nodes).expect("json");
        assert!(!json.contains("javascript:"), "{json}");
        assert!(json.contains("\"href\":\"https://example.com\""), "{json}");
        assert!(
            !json.contains("x.png"),
            "an image's source went out: {json}"
        );
    }

    #[test]
    fn a_reply_cut_mid_fence_renders_what_is_there() {
        let nodes = render("Here:\n\n```python\ndef f(:\n");
        assert_eq!(text(&nodes), "Here:def f(:\n");
        let nodes = render("a | b\n--|--\n1 | 2\n");
        let mut t = Vec::new();
        tags(&nodes, &mut t);
        assert_eq!(t, ["table", "thead", "tr", "th", "th", "tr", "td", "td"]);
    }
}
