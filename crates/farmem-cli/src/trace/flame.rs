//! A flame graph of folded stacks (`outer;...;inner COUNT` lines) as a self-contained SVG:
//! one box per frame, as wide as the faults under it, callers below callees; the full name
//! and count are in each box's tooltip. Small enough not to need a plotting dependency.

use std::collections::BTreeMap;
use std::fmt::Write as _;

const WIDTH: f64 = 1200.0;
const ROW: f64 = 16.0;
const PAD: f64 = 30.0;
/// Boxes narrower than this are left out (they would be unreadable slivers).
const MIN_WIDTH: f64 = 0.5;

#[derive(Default)]
struct Node {
    count: u64,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn depth(&self) -> usize {
        1 + self.children.values().map(Node::depth).max().unwrap_or(0)
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A warm color per name, stable across runs (so the same function keeps its color).
fn color(name: &str) -> String {
    let h = name
        .bytes()
        .fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619));
    format!(
        "rgb({},{},{})",
        205 + (h % 50),
        90 + ((h >> 8) % 130),
        (h >> 16) % 55
    )
}

/// The SVG for `folded`, titled after the fault kind.
pub fn svg(kind: &str, folded: &str) -> String {
    let mut root = Node::default();
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        root.count += n;
        let mut node = &mut root;
        for frame in stack.split(';').filter(|f| !f.is_empty()) {
            node = node.children.entry(frame.to_string()).or_default();
            node.count += n;
        }
    }
    let depth = root.depth();
    let height = PAD * 2.0 + depth as f64 * ROW;
    let mut out = String::new();
    let _ = write!(
        out,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" \
         font-family=\"monospace\" font-size=\"11\">\n\
         <rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{height}\" fill=\"#f8f8f8\"/>\n\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">far-memory faults: {} ({} sampled)</text>\n",
        WIDTH / 2.0,
        escape(kind),
        root.count
    );
    if root.count > 0 {
        let scale = (WIDTH - 20.0) / root.count as f64;
        draw(
            &mut out,
            "all",
            &root,
            10.0,
            height - PAD - ROW,
            scale,
            root.count,
        );
    }
    out.push_str("</svg>\n");
    out
}

fn draw(out: &mut String, name: &str, node: &Node, x: f64, y: f64, scale: f64, total: u64) {
    let w = node.count as f64 * scale;
    if w < MIN_WIDTH {
        return;
    }
    let pct = node.count as f64 / total as f64 * 100.0;
    let _ = write!(
        out,
        "<g><title>{} ({} faults, {:.1}%)</title><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" \
         height=\"{:.1}\" fill=\"{}\" rx=\"2\"/>",
        escape(name),
        node.count,
        pct,
        ROW - 1.0,
        color(name)
    );
    // As many characters as fit (7 px each), with ".." when cut.
    let fit = ((w - 6.0) / 7.0).max(0.0) as usize;
    if fit >= 3 {
        let shown: String = if name.chars().count() > fit {
            name.chars().take(fit - 2).collect::<String>() + ".."
        } else {
            name.to_string()
        };
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x + 3.0,
            y + ROW - 4.0,
            escape(&shown)
        );
    }
    out.push_str("</g>\n");
    let mut cx = x;
    for (child, c) in &node.children {
        draw(out, child, c, cx, y - ROW, scale, total);
        cx += c.count as f64 * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_nest_and_names_are_escaped() {
        let s = svg("fetch", "main;scan<int> 3\nmain;probe 1\n");
        assert!(s.starts_with("<?xml"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert!(s.contains("scan&lt;int&gt; (3 faults, 75.0%)"));
        assert!(s.contains("main (4 faults, 100.0%)"));
        assert!(!s.contains("scan<int>"));
        assert_eq!(s.matches("<g>").count(), s.matches("</g>").count());
        let empty = svg("zero-fill", "");
        assert!(empty.contains("0 sampled"));
    }
}
